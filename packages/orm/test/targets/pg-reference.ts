// The ORM suite's reference target on PostgreSQL: plain `pg` as the "ORM", through a SqlTransactions built here,
// so the suite and PostgresStore's `transactions` path are proved before any integration lands.
import type { SqlTransactions } from '@oncely/core/adapter';
import { PostgresStore } from '@oncely/postgres';
import type { OrmSuiteTarget, OrmSuiteTargetOptions } from '@oncely/testing';
import pg from 'pg';
import { ormTransactions } from '../../src/shared';

const connectionString = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** Transactions on clients of `pool`, the way an ORM without its own API would offer them. */
export function pgTransactions(pool: pg.Pool): SqlTransactions<pg.PoolClient> {
  return {
    dialect: 'postgres',
    run: async (work) => {
      const client = await pool.connect();
      let broken: Error | undefined;
      try {
        await client.query('BEGIN');
        try {
          await work(client);
        } catch (error) {
          await client.query('ROLLBACK').catch((rollbackError: Error) => (broken = rollbackError));
          throw error;
        }
        await client.query('COMMIT');
      } finally {
        // A client whose rollback failed is discarded, not handed to the next caller.
        client.release(broken);
      }
    },
    query: async (tx, statement, params) => {
      const result = await tx.query(statement, params as unknown[]);
      return { rows: result.rows, rowCount: result.rowCount ?? 0 };
    },
  };
}

export async function createTarget({ id }: OrmSuiteTargetOptions): Promise<OrmSuiteTarget<pg.PoolClient>> {
  const schema = `oncely_orm_${id}`;
  const pool = new pg.Pool({ connectionString, max: 10 });
  const transactions = ormTransactions('pg (reference)', pgTransactions(pool));
  const store = new PostgresStore({ pool, schema, transactions });
  return {
    name: 'pg on PostgreSQL (reference)',
    dialect: 'postgres',
    store,
    setup: async () => {
      await store.migrate();
      await pool.query(
        `CREATE TABLE IF NOT EXISTS "${schema}".orders (id serial PRIMARY KEY, key text NOT NULL)`,
      );
    },
    insertOrder: async (tx, key) => {
      await tx.query(`INSERT INTO "${schema}".orders (key) VALUES ($1)`, [key]);
    },
    countOrders: async (key) => {
      const { rows } = await pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM "${schema}".orders WHERE $1::text IS NULL OR key = $1`,
        [key ?? null],
      );
      return rows[0]?.n ?? 0;
    },
    transactionOf: transactions.transactionOf,
    drop: async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    },
    close: () => pool.end(),
  };
}
