// docs/orm/prisma.md's two examples, compiled against generated clients (the docs check cannot import a client
// that `prisma generate` writes into a user's project). Not run: `npm run typecheck` compiles test/.
import { idempotency } from '@oncely/express';
import { MySQLStore } from '@oncely/mysql';
import { PostgresStore } from '@oncely/postgres';
import { PrismaMariaDb } from '@prisma/adapter-mariadb';
import { PrismaPg } from '@prisma/adapter-pg';
import express from 'express';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { prismaTransactions } from '../src/prisma/index';
import { PrismaClient as MariaDbClient } from './prisma/generated/mariadb/client';
import { PrismaClient } from './prisma/generated/postgres/client';

export async function completeHandler(): Promise<void> {
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 20 });
  const prisma = new PrismaClient({ adapter: new PrismaPg(pool) });
  // Every covered request runs in one interactive transaction: give it the time your slowest handler needs.
  const transactions = prismaTransactions(prisma, { timeout: 30_000, maxWait: 5_000 });
  const store = new PostgresStore({ pool, transactions });
  await store.migrate();

  const app = express();
  app.use(express.json());
  app.post('/orders', idempotency({ store, transactional: true }), async (req, res, next) => {
    try {
      const tx = transactions.transactionOf(req); // Prisma.TransactionClient of this request's transaction
      const order = await tx.order.create({
        data: { key: String(req.body.key), amount: Number(req.body.amount) },
      });
      res.status(201).json(order); // sent after the order and the record commit
    } catch (error) {
      next(error); // rolls back the order and the record: a retry runs again
    }
  });
  app.listen(3000);
}

export async function onMariaDb(): Promise<void> {
  const prisma = new MariaDbClient({
    adapter: new PrismaMariaDb({ host: '127.0.0.1', user: 'root', database: 'shop', connectionLimit: 20 }),
  });
  const transactions = prismaTransactions(prisma, { timeout: 30_000, maxWait: 5_000 });
  const store = new MySQLStore({
    pool: mysql.createPool({ uri: process.env.MYSQL_URL, connectionLimit: 10 }),
    transactions,
  });
  await store.migrate();
}
