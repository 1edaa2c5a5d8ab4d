/**
 * Transactional mode through Kysely: oncely's statements run in Kysely's transaction, so that a handler writing
 * with the transaction it is handed commits together with the idempotency record.
 * {@link kyselyTransactions} makes the `transactions` option of a `PostgresStore` or `MySQLStore`.
 *
 * @module @oncely/orm/kysely
 */
import { IdempotencySetupError } from '@oncely/core';
import type { SqlResult } from '@oncely/core/adapter';
import { CompiledQuery, type Kysely, type QueryResult, sql, type Transaction } from 'kysely';
import { type OrmTransactions, ormTransactions } from '../shared';

/**
 * The database `db` compiles for, read from how it writes an identifier and a parameter (`"a"` and `$1` on
 * PostgreSQL, `` `a` `` and `?` on MySQL): public API only, and the same whichever copy of Kysely built `db`.
 */
function dialectOf<DB>(db: Kysely<DB>): 'postgres' | 'mysql' {
  const { sql: text } = sql`${sql.ref('a')} ${1}`.compile(db);
  if (text === '"a" $1') return 'postgres';
  if (text === '`a` ?') return 'mysql';
  throw new IdempotencySetupError(
    `kyselyTransactions: this Kysely dialect compiles \`${text}\`, neither PostgreSQL's nor MySQL's; use PostgresDialect (pg) or MysqlDialect (mysql2).`,
  );
}

/** Kysely's result as one shape: `numAffectedRows` for INSERT, UPDATE and DELETE, the rows otherwise. */
function normalise(result: QueryResult<Record<string, unknown>>): SqlResult {
  const rows = result.rows ?? [];
  return {
    rows,
    rowCount: result.numAffectedRows === undefined ? rows.length : Number(result.numAffectedRows),
  };
}

/**
 * Lets oncely's SQL stores hold a key inside a Kysely transaction: the handler gets Kysely's own
 * `Transaction<DB>` and writes through it as usual, and the completed record commits with those writes. Pass the
 * result as the store's `transactions` (the store runs on the same database as `db`), and read the request's
 * transaction in the handler with its `transactionOf(req)`.
 *
 * @example
 * const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
 * const transactions = kyselyTransactions(db);
 * const store = new PostgresStore({ pool, transactions });
 * // in a handler: await transactions.transactionOf(req).insertInto('orders').values({ ... }).execute();
 */
export function kyselyTransactions<DB>(db: Kysely<DB>): OrmTransactions<Transaction<DB>> {
  const dialect = dialectOf(db);
  return ormTransactions('@oncely/orm/kysely', {
    dialect,
    async run(work) {
      await db.transaction().execute(work);
    },
    async query(tx, statement, params) {
      return normalise(
        await tx.executeQuery(
          CompiledQuery.raw(statement, [...params]) as CompiledQuery<Record<string, unknown>>,
        ),
      );
    },
  });
}
