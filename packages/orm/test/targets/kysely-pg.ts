// Kysely's PostgresDialect (pg): the handler inserts with Kysely's query builder on its Transaction.
import { PostgresStore } from '@oncely/postgres';
import type { OrmSuiteTargetOptions } from '@oncely/testing';
import { Kysely, PostgresDialect, type Transaction } from 'kysely';
import { kyselyTransactions } from '../../src/kysely';
import { ormTarget, postgresTables } from './databases';

export async function createTarget({ id }: OrmSuiteTargetOptions) {
  const tables = postgresTables(id);
  type Database = Record<string, { id: number | undefined; key: string }>;
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool: tables.pool }) });
  const transactions = kyselyTransactions(db);
  const store = new PostgresStore({ pool: tables.pool, schema: tables.schema, transactions });
  return ormTarget<Transaction<Database>>({
    name: 'kysely (pg) on PostgreSQL',
    dialect: 'postgres',
    store,
    tables,
    transactions,
    insertOrder: (tx, key) =>
      tx.withSchema(tables.schema).insertInto('orders').values({ id: undefined, key }).execute(),
    close: () => db.destroy(), // ends the pool,
  });
}
