import { randomBytes } from 'node:crypto';
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

/** A postgres.js client for a test file, quiet about the NOTICEs of `CREATE ... IF NOT EXISTS`. */
export function postgresJs(
  options: postgres.Options<Record<string, postgres.PostgresType>> = {},
): postgres.Sql {
  return postgres(connectionString, { max: 20, onnotice: () => {}, ...options });
}
