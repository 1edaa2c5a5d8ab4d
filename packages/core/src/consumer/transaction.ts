import { runInContext } from '../shared/context';
import { InvalidValueError, StoreOperationError } from '../shared/errors';
import { HookRunner } from '../shared/hooks';
import { type Logger, silentLogger } from '../shared/logger';
import { KeyProtocol, verdictOf } from '../shared/protocol';
import { ExecutionContext, stepSettings } from '../shared/steps';
import type {
  CompletedResult,
  TransactionAcquiredResult,
  TransactionalIdempotencyStore,
} from '../stores/store';
import { IdempotencyStoreError } from './errors';
import { replayResult } from './result-codec';

/** How `runStoreTransaction()` checks and keeps the record. */
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
 * `cause` the store's error); an error thrown by `work` rolls everything back and is re-thrown. The result is stored
 * as JSON. `PostgresStore.transaction()` runs on this; the transactional consumers (`@oncely/pg-boss`) run on the
 * same protocol through the consumer runtime, which reports it to their hooks.
 */
export function runStoreTransaction<T, Db = unknown>(
  store: TransactionalIdempotencyStore,
  key: string,
  options: StoreTransactionOptions,
  work: (db: Db) => Promise<T>,
): Promise<{
  /** `executed`: `work` ran and committed; `replayed`: a completed record gave its result. */
  outcome: 'executed' | 'replayed';
  /** What `work` returned, or the stored result for a duplicate. */
  result: T;
}> {
  const protocol = new KeyProtocol(
    store,
    new HookRunner({}, 'consumer', new Set()),
    options.lockTimeoutMs ?? 30_000,
  );
  return transactOnce(protocol, key, options.fingerprint, options.ttlMs, work, silentLogger);
}

/**
 * `runStoreTransaction` on a wrapper's protocol: its store (as observed), hooks and lease. Decisions go to
 * `onDecision` as idempotent() reports them, except that a run whose transaction rolled back or failed to commit is
 * counted by nobody (nothing it did was kept: the retry decides again). The work runs as an execution in flight.
 */
export async function transactOnce<T, Db>(
  protocol: KeyProtocol,
  key: string,
  fingerprint: string | undefined,
  ttlMs: number,
  work: (db: Db) => Promise<T>,
  log: Logger,
): Promise<{ outcome: 'executed' | 'replayed'; result: T }> {
  const hooks = protocol.hooks;
  let acquired: Awaited<ReturnType<TransactionalIdempotencyStore['acquireInTransaction']>>;
  try {
    acquired = (await protocol.acquireInTransaction(key, fingerprint ?? '')) as typeof acquired;
  } catch (error) {
    // Nothing ran: the same error as idempotent()'s, so that a consumer delays the message (a store outage is not
    // a failure of the work) and reports the decision as store_error.
    protocol.acquireFailed(key, error, undefined, log);
    throw new IdempotencyStoreError(key, 'acquire', { cause: error });
  }
  const verdict = verdictOf(acquired, fingerprint ?? '', fingerprint !== undefined);
  if (verdict === 'completed') {
    hooks.decided('replayed', key, undefined, log);
    return {
      outcome: 'replayed',
      result: replayResult<T>(undefined, key, (acquired as CompletedResult).response),
    };
  }
  // A duplicate of a transaction still open is not waited for here: the consumer delays it.
  if (verdict !== 'acquired') {
    // A record kept with steps for another fingerprint was taken over in this transaction: roll it back untouched.
    if (verdict === 'mismatch') await protocol.giveBack(key, acquired, log);
    throw protocol.refusal(verdict, key, acquired, undefined, log);
  }
  const { transaction } = acquired as TransactionAcquiredResult;
  hooks.executionStarted(key, log);
  // Steps are part of the transaction: checked and run in this attempt only, nothing recorded beside it (what the
  // work writes commits or rolls back with its record, and a committed record holds no steps).
  const context = new ExecutionContext(key, key, transaction.db, stepSettings(protocol, ttlMs), log);
  let result: T;
  let body: Buffer;
  try {
    try {
      try {
        result = await runInContext(context, () => work(transaction.db as Db));
      } finally {
        ExecutionContext.finish(context);
      }
      const json = JSON.stringify(result);
      if (json === undefined)
        throw new InvalidValueError(
          `oncely: the result of the work for key ${JSON.stringify(key)} is not JSON-serialisable (got ${typeof result}); nothing was committed.`,
        );
      body = Buffer.from(json);
    } catch (error) {
      await protocol.rollBack(transaction, key, 'error', undefined, log);
      throw error;
    }
    let committed: boolean;
    try {
      committed = await transaction.commit(
        { status: 200, headers: { 'content-type': 'application/json' }, body },
        ttlMs,
      );
    } catch (error) {
      protocol.commitFailed(key, error, log);
      throw error;
    }
    protocol.completed(key, committed, 200, log);
    if (!committed) {
      throw new StoreOperationError(
        `oncely: the record for key ${JSON.stringify(key)} could not be completed; nothing was committed.`,
      );
    }
  } finally {
    hooks.executionEnded(key, log);
  }
  hooks.decided('executed', key, undefined, log);
  return { outcome: 'executed', result };
}
