// Drizzle over mysql2 on MariaDB: the handler inserts with Drizzle's query builder on Drizzle's transaction.
import { MySQLStore } from '@oncely/mysql';
import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { int, mysqlTable, varchar } from 'drizzle-orm/mysql-core';
import { drizzle } from 'drizzle-orm/mysql2';
import { type DrizzleTransaction, drizzleTransactions } from '../../src/drizzle';
import { mysqlTables, ormTarget } from './databases';

export async function createTarget({ id }: OrmSuiteTargetOptions) {
  const tables = mysqlTables(id);
  const orders = mysqlTable(tables.orders, {
    id: int('id').autoincrement().primaryKey(),
    key: varchar('key', { length: 100 }).notNull(),
  });
  const db = drizzle({ client: tables.promisePool, schema: { orders }, mode: 'default' });
  const transactions = drizzleTransactions(db);
  const store = new MySQLStore({ pool: tables.promisePool, table: tables.table, transactions });
  return ormTarget<DrizzleTransaction<typeof db>>({
    name: 'drizzle (mysql2) on MariaDB',
    dialect: 'mysql',
    store,
    tables,
    transactions,
    insertOrder: (tx, key) => tx.insert(orders).values({ key }),
    close: async () => {
      await store.close();
      await tables.promisePool.end();
    },
  });
}
