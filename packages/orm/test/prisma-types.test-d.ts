// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/, after generating the
// Prisma clients). Each `@ts-expect-error` fails the type check when the line under it compiles.
import { PrismaMariaDb } from '@prisma/adapter-mariadb';
import { PrismaPg } from '@prisma/adapter-pg';
import { prismaTransactions } from '../src/prisma/index';
import {
  PrismaClient as MariaDbClient,
  type Prisma as MariaDbPrisma,
} from './prisma/generated/mariadb/client';
import { type Prisma, PrismaClient } from './prisma/generated/postgres/client';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only when `A` and `B` are the same type. */
const same = <A, B>(_proof: Equal<A, B>): void => undefined;

declare const request: { idempotency?: { db: unknown } };

export function theHandlerGetsPrismasTransactionClient(): void {
  const prisma = new PrismaClient({
    adapter: new PrismaPg({ connectionString: 'postgresql://localhost/test' }),
  });
  const transactions = prismaTransactions(prisma, { timeout: 10_000, isolationLevel: 'ReadCommitted' });
  const tx = transactions.transactionOf(request);
  same<typeof tx, Prisma.TransactionClient>(true);
  tx.order.create({ data: { key: 'k', amount: 1 } });
}

export function onMariaDbToo(): void {
  const prisma = new MariaDbClient({ adapter: new PrismaMariaDb({ host: 'localhost', database: 'test' }) });
  const tx = prismaTransactions(prisma).transactionOf(request);
  same<typeof tx, MariaDbPrisma.TransactionClient>(true);
}

export function anExtendedClientGivesItsOwnTransactionClient(): void {
  const base = new PrismaClient({
    adapter: new PrismaPg({ connectionString: 'postgresql://localhost/test' }),
  });
  const prisma = base.$extends({ model: { order: { big: () => 'big' } } });
  const tx = prismaTransactions(prisma).transactionOf(request);
  tx.order.big();
}

export function whatIsNotAPrismaClientDoesNotCompile(): void {
  // @ts-expect-error no interactive $transaction
  prismaTransactions({ query: async () => [] });
  const prisma = new PrismaClient({
    adapter: new PrismaPg({ connectionString: 'postgresql://localhost/test' }),
  });
  // @ts-expect-error Prisma's option is `timeout`, in milliseconds
  prismaTransactions(prisma, { timeoutMs: 10_000 });
  // @ts-expect-error not an isolation level
  prismaTransactions(prisma, { isolationLevel: 'read committed' });
}
