import { randomBytes } from 'node:crypto';
import type { TransactionalSuiteTarget } from '@oncely/testing';
import pg from 'pg';
import postgres from 'postgres';

export const connectionString = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** A pool and a schema of this test file's own, dropped afterwards: tests never touch shared tables. */
export function testSchema(): { schema: string; pool: () => pg.Pool; drop: () => Promise<void> } {
  const schema = `oncely_test_${randomBytes(6).toString('hex')}`;
  let pool: pg.Pool | undefined;
  return {
    schema,
    pool: () => {
      pool ??= new pg.Pool({ connectionString, max: 20 });
      return pool;
    },
    drop: async () => {
      if (pool === undefined) return;
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await pool.end();
    },
  };
}

/**
 * What the transactional suite asks of a test schema with `charges (key)` and `deferred` tables beside the store's,
 * for a transaction that is a pg client: the write on it or on the pool, the reads outside any transaction, and a
 * row the deferred unique constraint accepts now and refuses at COMMIT.
 */
export function pgSuiteParts(
  db: ReturnType<typeof testSchema>,
): Omit<TransactionalSuiteTarget<pg.PoolClient>, 'store' | 'transactionOf' | 'expectIdle'> {
  const insert = () => `INSERT INTO "${db.schema}".charges (key) VALUES ($1)`;
  return {
    charge: (client, key) => client.query(insert(), [key]),
    chargeOutside: (key) => db.pool().query(insert(), [key]),
    count: async (key) =>
      Number(
        (await db.pool().query(`SELECT count(*) FROM "${db.schema}".charges WHERE key = $1`, [key])).rows[0]
          .count,
      ),
    recordState: async (key) =>
      (await db.pool().query(`SELECT state FROM "${db.schema}".oncely_idempotency WHERE key = $1`, [key]))
        .rows[0]?.state as string | undefined,
    breakCommit: async (client) => {
      await client.query(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
    },
  };
}

/** A postgres.js client for a test file, quiet about the NOTICEs of `CREATE ... IF NOT EXISTS`. */
export function postgresJs(
  options: postgres.Options<Record<string, postgres.PostgresType>> = {},
): postgres.Sql {
  return postgres(connectionString, { max: 20, onnotice: () => {}, ...options });
}
