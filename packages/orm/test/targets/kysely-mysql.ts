// Kysely's MysqlDialect (mysql2) on MariaDB: the handler inserts with Kysely's query builder on its Transaction.
import { MySQLStore } from '@oncely/mysql';
import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { Kysely, MysqlDialect, type Transaction } from 'kysely';
import { kyselyTransactions } from '../../src/kysely';
import { mysqlTables, ormTarget } from './databases';

export async function createTarget({ id }: OrmSuiteTargetOptions) {
  const tables = mysqlTables(id);
  type Database = Record<string, { id: number | undefined; key: string }>;
  const db = new Kysely<Database>({ dialect: new MysqlDialect({ pool: tables.pool }) });
  const transactions = kyselyTransactions(db);
  const store = new MySQLStore({ pool: tables.promisePool, table: tables.table, transactions });
  return ormTarget<Transaction<Database>>({
    name: 'kysely (mysql2) on MariaDB',
    dialect: 'mysql',
    store,
    tables,
    transactions,
    insertOrder: (tx, key) => tx.insertInto(tables.orders).values({ id: undefined, key }).execute(),
    close: async () => {
      await store.close();
      await db.destroy(); // ends the pool
    },
  });
}
