/**
 * Transactional mode through Knex: oncely's statements run in a Knex transaction, so that a handler writing with
 * the transaction it is handed commits together with the idempotency record.
 * {@link knexTransactions} makes the `transactions` option of a `PostgresStore` or `MySQLStore`.
 *
 * @module @oncely/orm/knex
 */
import { IdempotencySetupError } from '@oncely/core';
import { type SqlResult, transactionOfRequest } from '@oncely/core/adapter';
import type { Knex } from 'knex';
import {
  type OrmTransactions,
  ormTransactions,
  splitPlaceholders,
  type TransactionalRequest,
} from '../shared';

/** What Knex's `client` carries that tells the database and the driver; Knex types the client loosely. */
interface KnexClientInfo {
  dialect?: unknown;
  driverName?: unknown;
  config?: { client?: unknown };
}

/** The database a Knex instance talks to, or why it is not one this integration has been tested with. */
function dialectOf(knex: Knex): 'postgres' | 'mysql' {
  const client = knex.client as KnexClientInfo;
  // `driverName` is set whether `client` was given as a name ('pg', 'postgresql') or as a Client class.
  if (client.driverName === 'pg' && client.dialect === 'postgresql') return 'postgres';
  if (client.driverName === 'mysql2') return 'mysql';
  const named = typeof client.config?.client === 'string' ? client.config.client : String(client.driverName);
  throw new IdempotencySetupError(
    `knexTransactions: Knex client '${named}' is not supported; use client 'pg' (PostgreSQL) or 'mysql2' (MySQL, MariaDB).`,
  );
}

/** pg's result object (`{ rows, rowCount }`) or mysql2's `[rows | ResultSetHeader, fields]`, as one shape. */
function normalise(dialect: 'postgres' | 'mysql', result: unknown): SqlResult {
  if (dialect === 'postgres') {
    const { rows, rowCount } = result as { rows?: Record<string, unknown>[]; rowCount?: number | null };
    const list = rows ?? [];
    return { rows: list, rowCount: rowCount ?? list.length };
  }
  const [first] = result as [unknown, unknown];
  if (Array.isArray(first)) return { rows: first as Record<string, unknown>[], rowCount: first.length };
  return { rows: [], rowCount: (first as { affectedRows?: number }).affectedRows ?? 0 };
}

/** Options of {@link knexTransactions}. */
export interface KnexTransactionsOptions {
  /**
   * The isolation level of the transactions oncely opens (the handler's writes run in them). Default: the
   * database's own (read committed on PostgreSQL, repeatable read on MySQL and MariaDB).
   */
  isolationLevel?: 'read uncommitted' | 'read committed' | 'repeatable read' | 'serializable';
}

/**
 * Lets oncely's SQL stores hold a key inside a Knex transaction: the handler gets the `Knex.Transaction` and writes
 * through it as usual, and the completed record commits with those writes. Pass the result as the store's
 * `transactions`; the store runs on the same database as `knex` (client `pg` or `mysql2`).
 *
 * @example
 * const store = new PostgresStore({ pool, transactions: knexTransactions(db) });
 */
export function knexTransactions(
  knex: Knex,
  options: KnexTransactionsOptions = {},
): OrmTransactions<Knex.Transaction> {
  const dialect = dialectOf(knex);
  const config: Knex.TransactionConfig =
    options.isolationLevel === undefined ? {} : { isolationLevel: options.isolationLevel };
  return ormTransactions('@oncely/orm/knex', {
    dialect,
    async run(work) {
      await knex.transaction(async (trx) => {
        await work(trx);
      }, config);
    },
    async query(trx, statement, params) {
      if (dialect === 'mysql')
        return normalise(dialect, await trx.raw(statement, [...params] as Knex.RawBinding[]));
      // Knex binds `?` once each and reads `??` as an identifier: a `$n` used twice becomes two bindings, and a
      // literal `?` (jsonb operators) is escaped so Knex leaves it to PostgreSQL.
      const { chunks, values } = splitPlaceholders('postgres', statement, params);
      const sql = chunks.map((chunk) => chunk.replaceAll('?', '\\?')).join('?');
      return normalise(dialect, await trx.raw(sql, values as Knex.RawBinding[]));
    },
  });
}

/**
 * The request's transaction in transactional mode, as Knex.Transaction: the same as `transactions.transactionOf(req)`, for
 * handlers in modules that do not see `transactions`. Throws `IdempotencySetupError` if the request has none.
 */
export function transactionOf(request: TransactionalRequest): Knex.Transaction {
  return transactionOfRequest<Knex.Transaction>(request, '@oncely/orm/knex');
}
