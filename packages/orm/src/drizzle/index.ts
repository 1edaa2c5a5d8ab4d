/**
 * Transactional mode through Drizzle: oncely's statements run in Drizzle's transaction, so that a handler writing
 * with the transaction it is handed commits together with the idempotency record.
 * {@link drizzleTransactions} makes the `transactions` option of a `PostgresStore` or `MySQLStore`.
 *
 * @module @oncely/orm/drizzle
 */
import { IdempotencySetupError } from '@oncely/core';
import type { SqlResult } from '@oncely/core/adapter';
import { entityKind, type SQL, type SQLChunk, sql } from 'drizzle-orm';
import type { MySqlDatabase, MySqlQueryResultHKT, PreparedQueryHKTBase } from 'drizzle-orm/mysql-core';
import type { PgDatabase, PgQueryResultHKT } from 'drizzle-orm/pg-core';
import { type OrmTransactions, ormTransactions, splitPlaceholders } from '../shared';

/** A Drizzle database on PostgreSQL (node-postgres, postgres-js) or MySQL/MariaDB (mysql2), with any schema. */
export type DrizzleDatabase =
  | PgDatabase<PgQueryResultHKT, Record<string, unknown>>
  | MySqlDatabase<MySqlQueryResultHKT, PreparedQueryHKTBase, Record<string, unknown>>;

/** The transaction `db.transaction(...)` hands its callback, as Drizzle types it for that database and schema. */
export type DrizzleTransaction<Db extends DrizzleDatabase> = Parameters<Parameters<Db['transaction']>[0]>[0];

type Driver = 'node-postgres' | 'postgres-js' | 'mysql2';

// Drizzle names each class with a static `entityKind`; walking the prototype chain finds the driver's session
// without importing the driver's module (which would load `pg` for a postgres-js user, and the reverse).
const SESSIONS: Record<string, Driver> = {
  NodePgSession: 'node-postgres',
  PostgresJsSession: 'postgres-js',
  MySql2Session: 'mysql2',
};

function driverOf(db: DrizzleDatabase): Driver {
  // `session` is internal in Drizzle's types but set on every database (PostgreSQL's also shows it in `_`).
  const session: unknown = (db as { session?: unknown }).session;
  const kinds: string[] = [];
  for (let proto = session === undefined ? null : Object.getPrototypeOf(session); proto; ) {
    const kind = (proto.constructor as { [entityKind]?: unknown })[entityKind];
    if (typeof kind === 'string') {
      const driver = SESSIONS[kind];
      if (driver) return driver;
      kinds.push(kind);
    }
    proto = Object.getPrototypeOf(proto);
  }
  throw new IdempotencySetupError(
    `drizzleTransactions: ${kinds[0] ?? 'this database'} is not supported; use a Drizzle database from drizzle-orm/node-postgres, drizzle-orm/postgres-js or drizzle-orm/mysql2.`,
  );
}

/** The statement as Drizzle SQL: its text as raw chunks and each placeholder as a bound parameter. */
function toDrizzleSql(dialect: 'postgres' | 'mysql', statement: string, params: readonly unknown[]): SQL {
  const { chunks, values } = splitPlaceholders(dialect, statement, params);
  const parts: SQLChunk[] = [sql.raw(chunks[0] ?? '')];
  values.forEach((value, i) => {
    parts.push(sql.param(value), sql.raw(chunks[i + 1] ?? ''));
  });
  return sql.join(parts);
}

type Rows = Record<string, unknown>[];

/** node-postgres's `{ rows, rowCount }`, postgres-js's row array (with `count`), mysql2's `[rows | header, fields]`. */
function normalise(driver: Driver, result: unknown): SqlResult {
  if (driver === 'node-postgres') {
    const { rows, rowCount } = result as { rows?: Rows; rowCount?: number | null };
    const list = rows ?? [];
    return { rows: list, rowCount: rowCount ?? list.length };
  }
  if (driver === 'postgres-js') {
    const list = result as Rows & { count?: number | null };
    return { rows: [...list], rowCount: list.count ?? list.length };
  }
  const [first] = result as [unknown, unknown];
  if (Array.isArray(first)) return { rows: first as Rows, rowCount: first.length };
  return { rows: [], rowCount: (first as { affectedRows?: number }).affectedRows ?? 0 };
}

/**
 * Lets oncely's SQL stores hold a key inside a Drizzle transaction: the handler gets Drizzle's own transaction
 * (typed for `db`'s driver and schema) and writes through it as usual, and the completed record commits with those
 * writes. Pass the result as the store's `transactions` (the store runs on the same database as `db`), and read the
 * request's transaction in the handler with its `transactionOf(req)`.
 *
 * @example
 * const db = drizzle(pool, { schema });
 * const transactions = drizzleTransactions(db);
 * const store = new PostgresStore({ pool, transactions });
 * // in a handler: await transactions.transactionOf(req).insert(orders).values({ ... });
 */
export function drizzleTransactions<Db extends DrizzleDatabase>(
  db: Db,
): OrmTransactions<DrizzleTransaction<Db>> {
  const driver = driverOf(db);
  const dialect = driver === 'mysql2' ? 'mysql' : 'postgres';
  type Executor = { execute(query: SQL): PromiseLike<unknown> };
  type Opener = { transaction(work: (tx: DrizzleTransaction<Db>) => Promise<void>): Promise<void> };
  return ormTransactions('@oncely/orm/drizzle', {
    dialect,
    async run(work) {
      await (db as unknown as Opener).transaction(async (tx) => {
        await work(tx);
      });
    },
    async query(tx, statement, params) {
      const result = await (tx as unknown as Executor).execute(toDrizzleSql(dialect, statement, params));
      return normalise(driver, result);
    },
  });
}
