// Prisma on MariaDB (driver adapter @prisma/adapter-mariadb), in a database of the run's own, dropped afterwards.
import { MySQLStore } from '@oncely/mysql';
import type { OrmSuiteTarget, OrmSuiteTargetOptions } from '@oncely/testing';
import { PrismaMariaDb } from '@prisma/adapter-mariadb';
import mysql from 'mysql2/promise';
import { type PrismaTransactionOptions, prismaTransactions } from '../../src/prisma/index';
import { type Prisma, PrismaClient } from '../prisma/generated/mariadb/client';

const url = new URL(process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test');

export async function createTarget(
  { id }: OrmSuiteTargetOptions,
  // The concurrency test queues up to 500 transactions for the pool's 10 connections.
  transactionOptions: PrismaTransactionOptions = { timeout: 20_000, maxWait: 20_000 },
): Promise<OrmSuiteTarget<Prisma.TransactionClient>> {
  const database = `oncely_prisma_${id}`;
  const server = {
    host: url.hostname,
    port: Number(url.port || 3306),
    user: decodeURIComponent(url.username),
  };
  const admin = await mysql.createConnection(server);
  await admin.query(`CREATE DATABASE IF NOT EXISTS \`${database}\``);
  await admin.end();
  const pool = mysql.createPool({ ...server, database, connectionLimit: 10 });
  const prisma = new PrismaClient({
    adapter: new PrismaMariaDb({ ...server, database, connectionLimit: 10 }),
  });
  const transactions = prismaTransactions(prisma, transactionOptions);
  const store = new MySQLStore({ pool, transactions });
  return {
    name: 'Prisma on MariaDB',
    dialect: 'mysql',
    store,
    setup: async () => {
      await store.migrate();
      await pool.query(
        'CREATE TABLE IF NOT EXISTS orders (id int AUTO_INCREMENT PRIMARY KEY, `key` varchar(200) NOT NULL, amount int NOT NULL)',
      );
    },
    insertOrder: async (tx, key) => {
      await tx.order.create({ data: { key, amount: 1 } });
    },
    countOrders: (key) => (key === undefined ? prisma.order.count() : prisma.order.count({ where: { key } })),
    transactionOf: (request) => transactions.transactionOf(request),
    drop: async () => {
      await pool.query(`DROP DATABASE IF EXISTS \`${database}\``);
    },
    close: async () => {
      await prisma.$disconnect();
      await pool.end();
    },
  };
}
