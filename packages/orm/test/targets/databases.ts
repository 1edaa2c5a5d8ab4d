// The databases the ORM targets run on, each with tables named after the suite's id: made by the test process,
// found by its child processes, and dropped at the end. Orders are counted with plain SQL, outside any ORM.
import type { OrmSuiteRequest, OrmSuiteStore, OrmSuiteTarget } from '@oncely/testing';
import mysql, { type Pool as MysqlPool } from 'mysql2';
import type { Pool as MysqlPromisePool } from 'mysql2/promise';
import pg from 'pg';

const postgresUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const mysqlUrl = process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

/** Connections per pool: the concurrency test queues on it (each request holds one for its transaction). */
const POOL_SIZE = 10;

export function postgresTables(id: string) {
  const schema = `oncely_orm_${id}`;
  const pool = new pg.Pool({ connectionString: postgresUrl, max: POOL_SIZE });
  // A connection lost while Drizzle or Kysely hold its client (the commit-cut tests) emits 'error' on the client,
  // which pg leaves unhandled while it is checked out: it must not crash the run.
  pool.on('connect', (client) => client.on('error', () => {}));
  pool.on('error', () => {});
  return {
    url: postgresUrl,
    poolSize: POOL_SIZE,
    schema,
    pool,
    /** Run after the store's `migrate()`, which makes the schema. */
    createOrders: async () => {
      await pool.query(
        `CREATE TABLE IF NOT EXISTS "${schema}".orders (id serial PRIMARY KEY, key text NOT NULL)`,
      );
    },
    countOrders: async (key?: string) => {
      const { rows } = await pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM "${schema}".orders WHERE $1::text IS NULL OR key = $1`,
        [key ?? null],
      );
      return rows[0]?.n ?? 0;
    },
    drop: async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    },
  };
}

export function mysqlTables(id: string) {
  const table = `oncely_orm_${id}`;
  const orders = `oncely_orm_${id}_orders`;
  // A callback pool serves Kysely's MysqlDialect; its promise() view, over the same connections, the store.
  const pool: MysqlPool = mysql.createPool({ uri: mysqlUrl, connectionLimit: POOL_SIZE });
  const promisePool: MysqlPromisePool = pool.promise();
  return {
    table,
    orders,
    pool,
    promisePool,
    createOrders: async () => {
      await promisePool.query(
        `CREATE TABLE IF NOT EXISTS \`${orders}\` (id int AUTO_INCREMENT PRIMARY KEY, \`key\` varchar(100) NOT NULL) ENGINE=InnoDB`,
      );
    },
    countOrders: async (key?: string) => {
      const [rows] = await promisePool.query(
        `SELECT count(*) AS n FROM \`${orders}\` WHERE ? IS NULL OR \`key\` = ?`,
        [key ?? null, key ?? null],
      );
      return Number((rows as { n: number }[])[0]?.n ?? 0);
    },
    drop: async () => {
      await promisePool.query(`DROP TABLE IF EXISTS \`${orders}\`, \`${table}\``);
    },
  };
}

/** The tables' half of a target (made, counted, dropped by plain SQL above). */
interface Tables {
  createOrders(): Promise<void>;
  countOrders(key?: string): Promise<number>;
  drop(): Promise<void>;
}

/** A target from its ORM-specific parts: the store (built with the integration) and the insert through the ORM. */
export function ormTarget<Tx>(parts: {
  name: string;
  dialect: 'postgres' | 'mysql';
  store: OrmSuiteStore<Tx> & { migrate(): Promise<void> };
  tables: Tables;
  transactions: { transactionOf(request: OrmSuiteRequest): Tx };
  insertOrder(tx: Tx, key: string): Promise<unknown>;
  close(): Promise<void>;
}): OrmSuiteTarget<Tx> {
  const { store, tables, transactions } = parts;
  return {
    name: parts.name,
    dialect: parts.dialect,
    store,
    setup: async () => {
      await store.migrate();
      await tables.createOrders();
    },
    insertOrder: async (tx, key) => {
      await parts.insertOrder(tx, key);
    },
    countOrders: (key) => tables.countOrders(key),
    transactionOf: (request) => transactions.transactionOf(request),
    drop: () => tables.drop(),
    close: parts.close,
  };
}
