// Drizzle over Postgres.js, with the store on the same Postgres.js client (no `pg` at all): the handler inserts
// with Drizzle's query builder on Drizzle's transaction.
import { PostgresStore } from '@oncely/postgres';
import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { drizzle } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import { type DrizzleTransaction, drizzleTransactions } from '../../src/drizzle';
import { ormTarget, postgresTables } from './databases';
import { drizzleOrders } from './drizzle-schema';

export async function createTarget({ id }: OrmSuiteTargetOptions) {
  const tables = postgresTables(id);
  const orders = drizzleOrders(tables.schema);
  const client = postgres(tables.url, { max: tables.poolSize, onnotice: () => {} });
  const db = drizzle({ client, schema: { orders } });
  const transactions = drizzleTransactions(db);
  const store = new PostgresStore({ sql: client, schema: tables.schema, transactions });
  return ormTarget<DrizzleTransaction<typeof db>>({
    name: 'drizzle (postgres-js) on PostgreSQL',
    dialect: 'postgres',
    store,
    tables,
    transactions,
    insertOrder: (tx, key) => tx.insert(orders).values({ key }),
    close: async () => {
      // postgres.js's end() never resolves once a transaction's connection was lost (the commit-cut test): bounded.
      await client.end({ timeout: 1 });
      await tables.pool.end();
    },
  });
}
