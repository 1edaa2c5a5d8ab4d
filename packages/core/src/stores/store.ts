/**
 * A response as a store keeps it: status, the headers worth replaying, and the body bytes. A store gives back the
 * same status, header names and values (an array stays an array) and bytes.
 */
export interface StoredResponse {
  status: number;
  headers: Record<string, string | string[]>;
  body: Uint8Array;
}

export type RecordState = 'in_progress' | 'completed';

/** One idempotency record, as `get()` returns it. Times are epoch milliseconds on the store's clock. */
export interface IdempotencyRecord {
  fingerprint: string;
  state: RecordState;
  token: string;
  lockExpiresAt: number;
  response?: StoredResponse;
  expiresAt: number;
}

export interface AcquireOptions {
  /** Fingerprint of the request; stored with a new record and returned with an existing one. */
  fingerprint: string;
  /** Lease of the new in-progress record, in ms. */
  lockTimeoutMs: number;
}

/** There was no live record (or only an in-progress one whose lease ran out): the caller owns the key. */
export interface AcquiredResult {
  status: 'acquired';
  token: string;
}
/** Another owner holds a live lease on the key. */
export interface InProgressResult {
  status: 'in_progress';
  fingerprint: string;
  retryAfterMs: number;
}
/** The key holds a completed record: this is its stored response. */
export interface CompletedResult {
  status: 'completed';
  fingerprint: string;
  response: StoredResponse;
}
export type AcquireResult = AcquiredResult | InProgressResult | CompletedResult;

/**
 * Where records live. A store holds no policy: it answers each step, atomically, and the engine decides what the
 * answer means (replay, 409, 422, 503). Each method is one atomic operation, one round trip on a networked store
 * where the store allows it. `@oncely/store-suite` checks all of this; docs/stores/writing-a-store.md explains it.
 *
 * Keys are any string (the engine joins the scope and the key: spaces, braces, non-ASCII), and two different
 * strings are two records; a store may prefix them. Durations are whole milliseconds, at least 1. Expiry is
 * exact when read: a lease or TTL that ran out is absent to every method (`get` gives `undefined`, `delete`
 * resolves `false`), even if the store deletes it later.
 *
 * Ownership: a token owns its record from `acquire` until the record completes, is released, or its lease runs
 * out. `complete`, `release` and `renew` act and resolve `true` only while the token owns the record, and
 * otherwise resolve `false` and change nothing, so an owner whose lease ran out (and may have been taken over)
 * can never overwrite or delete the record. A rejection means the store failed (unreachable, timed out), never
 * "not yours".
 */
export interface IdempotencyStore {
  /**
   * Reads the key and, if it is free, takes it, in one atomic step:
   * - no record, a completed record past its TTL, or an in-progress record whose lease ran out: writes an
   *   in-progress record with `fingerprint` and a lease of `lockTimeoutMs`, and resolves `acquired` with a new
   *   token (opaque, never handed out twice for a key, such as a random UUID);
   * - an in-progress record with a live lease: `in_progress`, with the holder's fingerprint and the lease's
   *   remaining time (`retryAfterMs`, above 0 and at most the lease), which the engine sends as `Retry-After`;
   * - a completed record within its TTL: `completed`, with its fingerprint and its response. The caller must not
   *   change that response: its headers may be frozen and shared with later answers. Its body is the caller's own
   *   copy: a write into those bytes changes no later answer.
   * Of any number of concurrent calls for one free key, exactly one is `acquired`. Only `acquired` writes: an
   * `in_progress` or `completed` answer leaves the record, its fingerprint and its lease as they were. The
   * store does not compare fingerprints (the engine does, and answers 422); it gives back the stored one as it
   * was given. A rejection is a store error (503, or no protection with `fail-open`): if the write may still land
   * (a timeout), release the token behind it (`undoAcquire`), or the key stays blocked until the lease ends.
   */
  acquire(key: string, options: AcquireOptions): Promise<AcquireResult>;
  /**
   * Turns the token's in-progress record into a completed one holding `response`, to expire `ttlMs` from now,
   * keeping the fingerprint of `acquire`. Only while the token owns a live lease: otherwise (another token,
   * released, completed, lease over even with nobody taking it over) `false`, nothing written. The store keeps
   * its own copy of the status, headers and body bytes: the caller may reuse its buffer. Bodies are bytes, not
   * text, and may be empty. `false` is reported as fenced (`onFenced`), a rejection as a store error; the
   * request gets its response either way. An error with `recordWritten: true` says the record was written but
   * not made durable; one with a `confirmation` promise, that the store is still confirming it
   * (`onUnconfirmedWrite`).
   */
  complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean>;
  /**
   * Deletes the token's in-progress record, so that the next `acquire` takes the key (the handler failed, its
   * status is not cacheable, or its client left). Only while the token owns a live lease: otherwise (another
   * token, completed, lease over even with nobody taking it over: the key is free already) `false`, nothing
   * deleted. After a rejection the key frees itself when the lease ends.
   */
  release(key: string, token: string): Promise<boolean>;
  /**
   * Moves the token's lease end to `lockTimeoutMs` from now. Only while the token owns a live lease (a lease
   * that ran out is not revived, even with nobody taking it over): otherwise `false`, nothing written. The engine renews every third of `lockTimeout` while the
   * work runs; it stops at `false` (fenced) and tries again after a rejection.
   */
  renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean>;
  /**
   * The live record under `key`, if any, with times as epoch milliseconds and its response as `acquire` gives it
   * (not to be changed: headers may be frozen; the body is the caller's own copy).
   */
  get?(key: string): Promise<IdempotencyRecord | undefined>;
  /**
   * Removes the record under `key` whatever its state; `true` if there was a live one (a record whose lease or
   * TTL ran out counts as none, even if it was still stored). The engine never calls it.
   */
  delete?(key: string): Promise<boolean>;
  /**
   * Resolves once `key` is no longer held by a live lease (completed, released or gone), or after `timeoutMs`,
   * whichever comes first; resolves at once if the key is not held now. Lets wait mode wake on completion
   * instead of polling. Optional: the engine polls with backoff when a store lacks it, or when it rejects.
   */
  waitFor?(key: string, timeoutMs: number): Promise<void>;
  /** Frees what the store opened itself (timers, its own connections); a client you passed in stays yours. */
  close?(): Promise<void>;
}

/**
 * Transactional mode: the key is held inside a database transaction that the handler's own writes join, so
 * the business writes and the completed record commit together or not at all (no lease: a crashed owner's
 * transaction simply rolls back).
 */
export interface StoreTransaction {
  /** The database client of the transaction, handed to the handler (a `pg` `PoolClient` for PostgresStore). */
  readonly db: unknown;
  /**
   * Writes the completed record and commits. Resolves `true` once committed; `false` when the record is no longer
   * this transaction's to complete (PostgresStore: it rolls back, nothing committed); rejects if the commit failed,
   * in which case nothing the handler wrote survived either. On `false` the runtime reports the key as fenced
   * (`onFenced`) and rejects with an error saying nothing was committed: a consumer settles it as a failure
   * (the message is retried), and `PostgresStore.transaction()` rejects with it.
   */
  commit(response: StoredResponse, ttlMs: number): Promise<boolean>;
  /** Rolls everything back: the record and the handler's writes. */
  rollback(): Promise<void>;
}

export interface TransactionAcquiredResult {
  status: 'acquired';
  token: string;
  transaction: StoreTransaction;
}

/** A store that can also run executions inside a transaction (`transactional: true`). */
export interface TransactionalIdempotencyStore extends IdempotencyStore {
  acquireInTransaction(
    key: string,
    options: AcquireOptions,
  ): Promise<TransactionAcquiredResult | InProgressResult | CompletedResult>;
}
