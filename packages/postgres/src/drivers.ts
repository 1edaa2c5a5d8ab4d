import { type SqlTransactions, withinDeadline } from '@oncely/core/adapter';
import type { Pool, PoolClient } from 'pg';
import type { Sql, TransactionSql } from 'postgres';
import { hold } from './client';
import type { Query } from './rows';

/** What the store needs of a driver besides transactional mode: single statements, and a transaction of its own. */
export interface Driver {
  /** One statement outside any transaction (a pooled connection). */
  readonly query: Query;
  /** Runs `work` in a transaction of the store's own (`migrate()`, the outbox relay): committed if it resolves. */
  inTransaction<T>(work: (query: Query) => Promise<T>): Promise<T>;
}

export function pgQuery(db: Pool | PoolClient): Query {
  return async (statement, params) => {
    const result = await db.query(statement, params as unknown[]);
    return { rows: result.rows, rowCount: result.rowCount ?? 0 };
  };
}

export function pgDriver(pool: Pool): Driver {
  return {
    query: pgQuery(pool),
    async inTransaction(work) {
      const held = await hold(pool);
      const { client } = held;
      let failed: unknown;
      try {
        await client.query('BEGIN');
        const result = await work(pgQuery(client));
        await client.query('COMMIT');
        return result;
      } catch (error) {
        failed = error;
        // A broken connection gets no ROLLBACK (it would fail, or queue behind a statement that never answers).
        if (!held.broken(error)) await client.query('ROLLBACK').catch(() => {});
        throw error;
      } finally {
        held.release(held.broken(failed) ? failed : undefined);
      }
    },
  };
}

/** What a postgres.js statement that got no answer within `queryTimeout` rejects with. */
function queryTimeoutError(timeoutMs: number): Error {
  const error = new Error(
    `oncely/postgres: PostgreSQL did not answer within queryTimeout (${timeoutMs} ms); the statement may still run when it does.`,
  );
  error.name = 'QueryTimeoutError';
  return error;
}

/** `pending`, bounded by `timeoutMs` when there is one (`onTimeout` told first). */
function bounded<T>(
  pending: PromiseLike<T>,
  timeoutMs: number | undefined,
  onTimeout?: (error: Error) => void,
) {
  if (timeoutMs === undefined) return Promise.resolve(pending);
  return withinDeadline(timeoutMs, pending, () => queryTimeoutError(timeoutMs), onTimeout);
}

function postgresJsQuery(
  sql: Sql | TransactionSql,
  timeoutMs: number | undefined,
  onTimeout?: (error: Error) => void,
): Query {
  return async (statement, params) => {
    // `unsafe` is postgres.js's call for a statement with `$n` placeholders (not a tagged template).
    const result = await bounded(sql.unsafe(statement, params as never[]), timeoutMs, onTimeout);
    return { rows: result as unknown as Record<string, unknown>[], rowCount: result.count ?? 0 };
  };
}

/**
 * A `sql.begin` whose wait for a connection, BEGIN and ROLLBACK are each bounded by `timeoutMs`, and which gives up
 * (rejects at once) when `work` calls its `giveUp`, as a bounded statement does when it times out: the work then
 * rejects, so postgres.js sends ROLLBACK, never COMMIT, whenever the server answers. COMMIT itself is not bounded:
 * what the answer says depends on its outcome, so it is awaited.
 */
function begin<T>(
  sql: Sql,
  timeoutMs: number | undefined,
  work: (tx: TransactionSql, giveUp: (error: Error) => void) => Promise<T>,
): Promise<T> {
  if (timeoutMs === undefined) return sql.begin((tx) => work(tx, () => {})) as Promise<T>;
  return new Promise<T>((resolve, reject) => {
    let gaveUp = false;
    const giveUp = (error: Error): void => {
      if (gaveUp) return;
      gaveUp = true;
      reject(error);
    };
    let timer = setTimeout(() => giveUp(queryTimeoutError(timeoutMs)), timeoutMs);
    (
      sql.begin(async (tx) => {
        clearTimeout(timer);
        // Begun after the caller gave up: roll back at once, nobody is waiting for this transaction.
        if (gaveUp) throw queryTimeoutError(timeoutMs);
        let value: T;
        try {
          value = await work(tx, giveUp);
        } catch (error) {
          // The ROLLBACK postgres.js sends now is bounded too: past timeoutMs the caller gets the work's own error
          // without waiting for it (rolled back either way).
          timer = setTimeout(() => giveUp(error as Error), timeoutMs);
          throw error;
        }
        // A statement of it timed out meanwhile: the caller was told it failed, so nothing of it may commit.
        if (gaveUp) throw queryTimeoutError(timeoutMs);
        return value;
      }) as Promise<T>
    ).then(
      (value) => {
        clearTimeout(timer);
        if (!gaveUp) resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        giveUp(error as Error);
      },
    );
  });
}

/** Transactional mode on postgres.js: each key's transaction is a `sql.begin`, the handler writing through its `TransactionSql`. */
export function postgresJsTransactions(
  sql: Sql,
  timeoutMs: number | undefined,
): SqlTransactions<TransactionSql> {
  // The transaction each store statement belongs to gives up with it.
  const giveUps = new WeakMap<TransactionSql, (error: Error) => void>();
  return {
    dialect: 'postgres',
    async run(work) {
      await begin(sql, timeoutMs, async (tx, giveUp) => {
        giveUps.set(tx, giveUp);
        await work(tx);
      });
    },
    query: (tx, statement, params) => postgresJsQuery(tx, timeoutMs, giveUps.get(tx))(statement, params),
  };
}

export function postgresJsDriver(sql: Sql, timeoutMs: number | undefined): Driver {
  return {
    query: postgresJsQuery(sql, timeoutMs),
    inTransaction<T>(work: (query: Query) => Promise<T>): Promise<T> {
      return begin(sql, timeoutMs, (tx, giveUp) => work(postgresJsQuery(tx, timeoutMs, giveUp)));
    },
  };
}
