/**
 * @services postgres
 */
import pg from 'pg';
import { commitCutSuite } from './commit-cut';

jest.setTimeout(30_000);

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const direct = new pg.Pool({ connectionString: url, max: 1 });
afterAll(() => direct.end());

/**
 * A deferred constraint trigger on the target's orders table that fails the COMMIT of key `refused` as a
 * serialization failure (which Prisma's adapter maps to its own kind, keeping the SQLSTATE as `originalCode`).
 */
async function refusingCommit(id: string): Promise<void> {
  const { rows } = await direct.query<{ schema: string }>(
    `SELECT n.nspname AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE c.relname = 'orders' AND n.nspname LIKE '%' || $1`,
    [id],
  );
  const schema = `"${rows[0]?.schema}"`;
  await direct.query(
    `CREATE FUNCTION ${schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN RAISE EXCEPTION 'refused at commit' USING ERRCODE = '40001'; END $$`,
  );
  await direct.query(
    `CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON ${schema}.orders DEFERRABLE INITIALLY DEFERRED
       FOR EACH ROW WHEN (NEW.key = 'refused') EXECUTE FUNCTION ${schema}.refuse()`,
  );
}

commitCutSuite(
  'postgres',
  'DATABASE_URL',
  url,
  ['knex-pg', 'drizzle-pg', 'drizzle-postgres-js', 'kysely-pg', 'typeorm-pg', 'prisma-pg'],
  refusingCommit,
);
