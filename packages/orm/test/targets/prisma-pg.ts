// Prisma on PostgreSQL (driver adapter @prisma/adapter-pg over the store's own pg pool), in a schema of the run's own.
import { PostgresStore } from '@oncely/postgres';
import type { OrmSuiteTarget, OrmSuiteTargetOptions } from '@oncely/testing';
import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import { type PrismaTransactionOptions, prismaTransactions } from '../../src/prisma/index';
import { type Prisma, PrismaClient } from '../prisma/generated/postgres/client';

const connectionString = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

export async function createTarget(
  { id }: OrmSuiteTargetOptions,
  // The concurrency test queues up to 500 transactions for the pool's 10 connections.
  transactionOptions: PrismaTransactionOptions = { timeout: 20_000, maxWait: 20_000 },
  poolSize = 10,
): Promise<OrmSuiteTarget<Prisma.TransactionClient>> {
  const schema = `oncely_prisma_${id}`;
  const pool = new pg.Pool({ connectionString, max: poolSize });
  // One pool for both: the adapter takes a pg Pool, and its `schema` is where the Order model's table lives.
  const prisma = new PrismaClient({ adapter: new PrismaPg(pool, { schema }) });
  const transactions = prismaTransactions(prisma, transactionOptions);
  const store = new PostgresStore({ pool, schema, transactions });
  return {
    name: 'Prisma on PostgreSQL',
    dialect: 'postgres',
    store,
    setup: async () => {
      await store.migrate();
      await pool.query(
        `CREATE TABLE IF NOT EXISTS "${schema}".orders (id serial PRIMARY KEY, key text NOT NULL, amount int NOT NULL)`,
      );
    },
    insertOrder: async (tx, key) => {
      await tx.order.create({ data: { key, amount: 1 } });
    },
    countOrders: (key) => (key === undefined ? prisma.order.count() : prisma.order.count({ where: { key } })),
    transactionOf: (request) => transactions.transactionOf(request),
    drop: async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    },
    close: async () => {
      await prisma.$disconnect();
      await pool.end();
    },
  };
}
