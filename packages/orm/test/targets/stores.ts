// The store side of the Knex and TypeORM targets: a PostgresStore or MySQLStore given the integration's
// `transactions`, on a driver pool of its own, with tables named after the suite's id.
import type { SqlTransactions } from '@oncely/core/adapter';
import { MySQLStore } from '@oncely/mysql';
import { PostgresStore } from '@oncely/postgres';
import type { OrmSuiteStore } from '@oncely/testing';
import mysql from 'mysql2/promise';
import pg from 'pg';

export const postgresUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
export const mysqlUrl = process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

/** Connections per ORM pool: each request of the concurrency test holds one for its transaction. */
export const POOL_SIZE = 10;

export interface TargetStore<Tx> {
  store: OrmSuiteStore<Tx>;
  /** PostgreSQL: the schema of the store's table, where the orders table goes too. */
  schema: string | undefined;
  /** The orders table's name. */
  orders: string;
  migrate(): Promise<void>;
  /** Drops the store's table (and on PostgreSQL the schema, orders included). */
  drop(): Promise<void>;
  close(): Promise<void>;
}

export function postgresStore<Tx>(id: string, transactions: SqlTransactions<Tx>): TargetStore<Tx> {
  const schema = `oncely_orm_${id}`;
  // The store's own steps (reads, the reaper) run on this pool; the transactions on the ORM's.
  const pool = new pg.Pool({ connectionString: postgresUrl, max: 4 });
  const store = new PostgresStore({ pool, schema, transactions });
  return {
    store,
    schema,
    orders: 'orders',
    migrate: () => store.migrate(),
    drop: async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    },
    close: () => pool.end(),
  };
}

export function mysqlStore<Tx>(id: string, transactions: SqlTransactions<Tx>): TargetStore<Tx> {
  const table = `oncely_orm_${id}`;
  const pool = mysql.createPool({ uri: mysqlUrl, connectionLimit: 4 });
  const store = new MySQLStore({ pool, table, transactions });
  return {
    store,
    schema: undefined,
    orders: `${table}_orders`,
    migrate: () => store.migrate(),
    drop: async () => {
      await pool.query(`DROP TABLE IF EXISTS \`${table}\``);
    },
    close: async () => {
      await store.close();
      await pool.end();
    },
  };
}
