/**
 * @services postgres
 */
import { randomBytes } from 'node:crypto';
import { PostgresStore } from '@oncely/postgres';
import pg from 'pg';
import { sqlSuite } from './sql-suite';
import { cliSuite } from './suite';

const SERVER = 'postgres://postgres@127.0.0.1:5432';
const URL = `${SERVER}/test`;
// A schema of this file's own, dropped afterwards: the shared database is never touched elsewhere.
const schema = `oncely_cli_${randomBytes(5).toString('hex')}`;
const pool = new pg.Pool({ connectionString: URL, max: 4 });

async function table(name: string) {
  const store = new PostgresStore({ pool, schema, table: name });
  await store.migrate();
  return { store, option: `${schema}.${name}` };
}

let records: PostgresStore;
beforeAll(async () => {
  records = (await table('records')).store;
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

cliSuite('oncely on PostgreSQL', {
  store: () => records,
  connection: () => ['--url', URL, '--table', `${schema}.records`],
});

sqlSuite('oncely on PostgreSQL: SQL tables', {
  server: SERVER,
  url: URL,
  table,
  foreignTable: async (name) => {
    await pool.query(`CREATE TABLE "${schema}"."${name}" (key text PRIMARY KEY, value text)`);
    return `${schema}.${name}`;
  },
  missingTable: () => `${schema}.no_such_table`,
});
