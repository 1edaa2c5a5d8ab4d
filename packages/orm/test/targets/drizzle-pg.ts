// Drizzle over node-postgres: the handler inserts with Drizzle's query builder on Drizzle's transaction.
import { PostgresStore } from '@oncely/postgres';
import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { drizzle } from 'drizzle-orm/node-postgres';
import { type DrizzleTransaction, drizzleTransactions } from '../../src/drizzle';
import { ormTarget, postgresTables } from './databases';
import { drizzleOrders } from './drizzle-schema';

export async function createTarget({ id }: OrmSuiteTargetOptions) {
  const tables = postgresTables(id);
  const orders = drizzleOrders(tables.schema);
  const db = drizzle({ client: tables.pool, schema: { orders } });
  const transactions = drizzleTransactions(db);
  const store = new PostgresStore({ pool: tables.pool, schema: tables.schema, transactions });
  return ormTarget<DrizzleTransaction<typeof db>>({
    name: 'drizzle (node-postgres) on PostgreSQL',
    dialect: 'postgres',
    store,
    tables,
    transactions,
    insertOrder: (tx, key) => tx.insert(orders).values({ key }),
    close: () => tables.pool.end(),
  });
}
