import type { TransactionalIdempotencyStore } from '../stores/store';
import { IdempotencyInProgressError, IdempotencyMismatchError, IdempotencyStoreError } from './errors';

export interface StoreTransactionOptions {
  /** Compared with a completed record's; `undefined`: not checked (and stored as ''). */
  fingerprint?: string | undefined;
  /** How long the completed record is kept, in ms. */
  ttlMs: number;
  /** Passed to `acquireInTransaction` (a transaction holds the key as long as it is open). Default: 30 s. */
  lockTimeoutMs?: number;
}

/**
 * Runs `work` once per key inside one store transaction that also writes the completion, so the work's own writes
 * and its record commit together (a consumer's side effects in the same database). A duplicate gets the stored
 * result (`replayed`); a duplicate of a transaction still open gets `IdempotencyInProgressError`; a key reused with
 * another fingerprint gets `IdempotencyMismatchError`; a store that fails to begin gets `IdempotencyStoreError` (its
 * `cause` the store's error); an error thrown by `work` rolls everything back and is re-thrown. The result is stored as JSON. `PostgresStore.transaction()` and the transactional consumers
 * (`@oncely/pg-boss`) run on this, the latter over the store as the consumer runtime observes it (timed, with the
 * work counted in flight).
 */
export async function runStoreTransaction<T, Db = unknown>(
  store: TransactionalIdempotencyStore,
  key: string,
  options: StoreTransactionOptions,
  work: (db: Db) => Promise<T>,
): Promise<{ outcome: 'executed' | 'replayed'; result: T }> {
  const fingerprint = options.fingerprint ?? '';
  let acquired: Awaited<ReturnType<TransactionalIdempotencyStore['acquireInTransaction']>>;
  try {
    acquired = await store.acquireInTransaction(key, {
      fingerprint,
      lockTimeoutMs: options.lockTimeoutMs ?? 30_000,
    });
  } catch (error) {
    // Nothing ran: the same error as idempotent()'s, so that a consumer delays the message (a store outage is not
    // a failure of the work) and reports the decision as store_error.
    throw new IdempotencyStoreError(key, 'acquire', { cause: error });
  }
  if (acquired.status === 'in_progress') throw new IdempotencyInProgressError(key, acquired.retryAfterMs);
  if (acquired.status === 'completed') {
    if (options.fingerprint !== undefined && acquired.fingerprint !== fingerprint)
      throw new IdempotencyMismatchError(key);
    return {
      outcome: 'replayed',
      result: JSON.parse(Buffer.from(acquired.response.body).toString('utf8')) as T,
    };
  }
  const { transaction } = acquired;
  let result: T;
  let body: Buffer;
  try {
    result = await work(transaction.db as Db);
    const json = JSON.stringify(result);
    if (json === undefined)
      throw new TypeError(
        `oncely: the result of the work for key ${JSON.stringify(key)} is not JSON-serialisable (got ${typeof result}); nothing was committed.`,
      );
    body = Buffer.from(json);
  } catch (error) {
    await transaction.rollback();
    throw error;
  }
  if (
    !(await transaction.commit(
      { status: 200, headers: { 'content-type': 'application/json' }, body },
      options.ttlMs,
    ))
  ) {
    throw new Error(
      `oncely: the record for key ${JSON.stringify(key)} could not be completed; nothing was committed.`,
    );
  }
  return { outcome: 'executed', result };
}
