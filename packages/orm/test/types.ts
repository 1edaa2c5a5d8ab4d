// Compiled by `npm run typecheck`, never run: the handler's transaction has each ORM's own type, for the db given.

import { int, mysqlTable, varchar } from 'drizzle-orm/mysql-core';
import { drizzle } from 'drizzle-orm/mysql2';
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres';
import { pgTable, serial, text } from 'drizzle-orm/pg-core';
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js';
import { Kysely, PostgresDialect, type Transaction } from 'kysely';
import mysql from 'mysql2/promise';
import pg from 'pg';
import postgres from 'postgres';
import { drizzleTransactions } from '../src/drizzle';
import { kyselyTransactions } from '../src/kysely';

const orders = pgTable('orders', { id: serial('id').primaryKey(), key: text('key').notNull() });
const myOrders = mysqlTable('orders', {
  id: int('id').primaryKey().autoincrement(),
  key: varchar('key', { length: 100 }).notNull(),
});
const request = {};

export async function drizzleTypes(): Promise<void> {
  const tx = drizzleTransactions(drizzlePg(new pg.Pool(), { schema: { orders } })).transactionOf(request);
  await tx.insert(orders).values({ key: 'a' });
  await tx.query.orders.findFirst(); // the relational API of the db's schema
  // @ts-expect-error not a column of orders
  await tx.insert(orders).values({ nope: 1 });

  const js = drizzleTransactions(drizzlePostgresJs(postgres())).transactionOf(request);
  await js.insert(orders).values({ key: 'a' });

  const my = drizzleTransactions(drizzle(mysql.createPool({}))).transactionOf(request);
  await my.insert(myOrders).values({ key: 'a' });
  // @ts-expect-error a PostgreSQL table on a MySQL transaction
  await my.insert(orders).values({ key: 'a' });

  // @ts-expect-error not a Drizzle database
  drizzleTransactions({});
}

interface Database {
  orders: { id: number | undefined; key: string };
}

export async function kyselyTypes(): Promise<void> {
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool: new pg.Pool() }) });
  const tx: Transaction<Database> = kyselyTransactions(db).transactionOf(request);
  await tx.insertInto('orders').values({ id: undefined, key: 'a' }).execute();
  // @ts-expect-error not a table of Database
  await tx.insertInto('nope');
}
