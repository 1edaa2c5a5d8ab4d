/**
 * @services mariadb
 */
import { randomBytes } from 'node:crypto';
import { MySQLStore } from '@oncely/mysql';
import mysql from 'mysql2/promise';
import { sqlSuite } from './sql-suite';
import { cliSuite } from './suite';

const SERVER = 'mysql://root@127.0.0.1:3306';
const URL = `${SERVER}/test`;
// Tables of this file's own, dropped afterwards: the shared database is never touched elsewhere.
const prefix = `oncely_cli_${randomBytes(4).toString('hex')}_`;
const made = new Set<string>();
const pool = mysql.createPool({ uri: URL, connectionLimit: 4 });

async function table(name: string) {
  made.add(prefix + name);
  const store = new MySQLStore({ pool, table: prefix + name });
  await store.migrate();
  return { store, option: prefix + name };
}

let records: MySQLStore;
beforeAll(async () => {
  records = (await table('records')).store;
});
afterAll(async () => {
  for (const name of made) await pool.query(`DROP TABLE IF EXISTS \`${name}\``);
  await pool.end();
});

cliSuite('oncely on MariaDB', {
  store: () => records,
  connection: () => ['--url', URL, '--table', `${prefix}records`],
});

sqlSuite('oncely on MariaDB: SQL tables', {
  server: SERVER,
  url: URL,
  table,
  foreignTable: async (name) => {
    made.add(prefix + name);
    await pool.query(`CREATE TABLE \`${prefix + name}\` (\`key\` VARBINARY(255) PRIMARY KEY, value TEXT)`);
    return prefix + name;
  },
  missingTable: () => `${prefix}no_such_table`,
});
