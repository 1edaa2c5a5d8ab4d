/**
 * Transactional mode through Prisma: oncely's statements run in Prisma's interactive transaction, so that a handler
 * writing with the transaction client it is handed commits together with the idempotency record.
 * {@link prismaTransactions} makes the `transactions` option of a `PostgresStore` or `MySQLStore`.
 *
 * @module @oncely/orm/prisma
 */
import { IdempotencySetupError } from '@oncely/core';
import type { SqlResult } from '@oncely/core/adapter';
import { type OrmTransactions, ormTransactions } from '../shared';

/** The raw-query methods oncely runs on a Prisma transaction client (`Prisma.TransactionClient` has them). */
export interface PrismaRawQueries {
  /** Runs a statement with its parameters (never spliced into its text) and resolves with the rows it returns. */
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): PromiseLike<T>;
  /**
   * Runs a statement with its parameters (never spliced into its text) and resolves with the count of rows it
   * affected.
   */
  $executeRawUnsafe(query: string, ...values: unknown[]): PromiseLike<number>;
}

/** Prisma's isolation levels (which of them a database accepts is Prisma's business). */
export type PrismaIsolationLevel =
  | 'ReadUncommitted'
  | 'ReadCommitted'
  | 'RepeatableRead'
  | 'Serializable'
  | 'Snapshot';

/** The options of Prisma's interactive transactions, passed to each `$transaction` oncely opens. */
export interface PrismaTransactionOptions {
  /**
   * Milliseconds the whole transaction, the handler included, may last before Prisma rolls it back (Prisma's
   * default: 5000). Set it above the store's `lockTimeout` and your slowest handler.
   */
  timeout?: number;
  /** Milliseconds to wait for a connection from the pool before giving up (Prisma's default: 2000). */
  maxWait?: number;
  /**
   * The isolation level of the transactions oncely opens (the handler's writes run in them). Default: the
   * database's own.
   */
  isolationLevel?: PrismaIsolationLevel;
}

/**
 * A Prisma client, generated (`new PrismaClient({ adapter })`) or extended with `$extends`, as oncely uses it: its
 * interactive `$transaction`. `Tx` is the client the callback receives, `Prisma.TransactionClient` for a plain one.
 */
export interface PrismaClientLike<Tx extends PrismaRawQueries> {
  /** Runs `fn` in an interactive transaction: committed when it resolves, rolled back when it rejects. */
  $transaction<R>(fn: (tx: Tx) => Promise<R>, options?: PrismaTransactionOptions): PromiseLike<R>;
}

export type { OrmTransactions, TransactionalRequest } from '../shared';

/** Options of {@link prismaTransactions}: Prisma's transaction options, and the database's dialect. */
export interface PrismaTransactionsOptions extends PrismaTransactionOptions {
  /**
   * The database behind the client's driver adapter. Read from the client when left out (`postgresql` and
   * `cockroachdb` are `'postgres'`, `mysql` is `'mysql'`, which covers MariaDB).
   */
  dialect?: 'postgres' | 'mysql';
}

/**
 * Whether a statement answers with rows (run with `$queryRawUnsafe`) rather than a count of affected rows
 * (`$executeRawUnsafe`): Prisma gives one or the other. Decided on the text outside parentheses and quotes, so that
 * `WITH done AS (UPDATE ... RETURNING key) INSERT ... SELECT key FROM done` counts its inserts, while a statement
 * whose own verb is SELECT, or that has its own RETURNING, gives rows.
 */
export function answersWithRows(statement: string): boolean {
  let top = '';
  let depth = 0;
  let quote = '';
  for (const c of statement) {
    if (quote !== '') {
      if (c === quote) quote = '';
    } else if (c === "'" || c === '"' || c === '`') quote = c;
    else if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (depth === 0) top += c;
  }
  if (/\breturning\b/i.test(top)) return true;
  const verb = /\b(select|values|show|table|insert|update|delete|replace|merge|do|call|set)\b/i.exec(top);
  return verb !== null && /^(select|values|show|table)$/i.test(verb[1] as string);
}

/**
 * Hands oncely's statements to Prisma's interactive transactions: `new PostgresStore({ pool, transactions })` or
 * `new MySQLStore({ pool, transactions })` with `transactions: prismaTransactions(prisma)`, then the handler writes
 * with `transactions.transactionOf(req)`. Needs a client built on a driver adapter (`@prisma/adapter-pg`,
 * `@prisma/adapter-mariadb`).
 */
export function prismaTransactions<Tx extends PrismaRawQueries>(
  prisma: PrismaClientLike<Tx>,
  options: PrismaTransactionsOptions = {},
): OrmTransactions<Tx> {
  if (prisma === null || typeof prisma !== 'object' || typeof prisma.$transaction !== 'function') {
    throw new IdempotencySetupError(
      'prismaTransactions(prisma): pass your PrismaClient (it has no $transaction).',
    );
  }
  const { dialect: chosen, ...transactionOptions } = options;
  const dialect = chosen ?? dialectOf(prisma);
  return ormTransactions<Tx>('@oncely/orm/prisma', {
    dialect,
    async run(work) {
      await prisma.$transaction((tx) => work(tx), transactionOptions);
    },
    async query(tx, statement, params) {
      if (answersWithRows(statement)) {
        const rows = await tx.$queryRawUnsafe<Record<string, unknown>[]>(statement, ...params);
        return { rows, rowCount: rows.length } satisfies SqlResult;
      }
      const rowCount = await tx.$executeRawUnsafe(statement, ...params);
      return { rows: [], rowCount };
    },
  });
}

/** The dialect of the client's provider, which Prisma keeps on the client (not in its public types). */
function dialectOf(prisma: object): 'postgres' | 'mysql' {
  const provider = (prisma as { _activeProvider?: unknown })._activeProvider;
  if (provider === 'postgresql' || provider === 'postgres' || provider === 'cockroachdb') return 'postgres';
  if (provider === 'mysql') return 'mysql';
  throw new IdempotencySetupError(
    `prismaTransactions(prisma): cannot tell the database of this client (provider ${String(provider)}); pass { dialect: 'postgres' } or { dialect: 'mysql' }.`,
  );
}
