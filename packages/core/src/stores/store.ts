/**
 * A response as a store keeps it: status, the headers worth replaying, and the body bytes. A store gives back the
 * same status, header names and values (an array stays an array) and bytes.
 */
export interface StoredResponse {
  /** The response status. */
  status: number;
  /** The headers worth replaying, names lower-cased. */
  headers: Record<string, string | string[]>;
  /** The body's bytes. */
  body: Uint8Array;
}

/**
 * `in_progress`: held by a live lease. `completed`: holds a response. `released`: a record that carries recorded
 * steps and is held by nobody (released, or its lease ran out): free for the next `acquire`, which resumes it.
 */
export type RecordState = 'in_progress' | 'completed' | 'released';

/**
 * The steps an execution recorded under its key (`recordStep`): each step's name and its result as the engine
 * encoded it (JSON text; the empty string for `undefined`). A store keeps and gives back these strings as they are.
 */
export type RecordedSteps = Readonly<Record<string, string>>;

/** One idempotency record, as `get()` returns it. Times are epoch milliseconds on the store's clock. */
export interface IdempotencyRecord {
  /** The fingerprint of the request that made the record. */
  fingerprint: string;
  /** Whether the record is held, completed or released. */
  state: RecordState;
  /** The owner's token: the one `acquire` returned to the execution that holds, or held, the key. */
  token: string;
  /** When the lease of an in-progress record ends. */
  lockExpiresAt: number;
  /** The stored response of a completed record. */
  response?: StoredResponse;
  /** When the record expires and the key is free again. */
  expiresAt: number;
  /** The steps recorded under the key, on an in-progress or released record that carries any. */
  steps?: RecordedSteps;
}

/** What `acquire` stores with a new record. */
export interface AcquireOptions {
  /** Fingerprint of the request; stored with a new record and returned with an existing one. */
  fingerprint: string;
  /** Lease of the new in-progress record, in ms. */
  lockTimeoutMs: number;
}

/** There was no live record (or only an in-progress one whose lease ran out): the caller owns the key. */
export interface AcquiredResult {
  /** The caller owns the key. */
  status: 'acquired';
  /** The owner's token, which `complete`, `release`, `renew` and `recordStep` must be given. */
  token: string;
  /**
   * Set when the key's record carried recorded steps (`recordStep`) and nobody held it (released, or its lease ran
   * out): the steps, for this execution to resume from. Absent (or empty) otherwise.
   */
  steps?: RecordedSteps;
  /**
   * With `steps`: the fingerprint the record kept (the store keeps the first attempt's fingerprint with its steps,
   * not the one this acquire passed), for the engine to compare; on a mismatch the engine releases the key again.
   */
  fingerprint?: string;
}
/** Another owner holds a live lease on the key. */
export interface InProgressResult {
  /** Another owner holds the key. */
  status: 'in_progress';
  /** The fingerprint stored with the record. */
  fingerprint: string;
  /** Time left on the owner's lease, in ms. */
  retryAfterMs: number;
}
/** The key holds a completed record: this is its stored response. */
export interface CompletedResult {
  /** The key holds a completed record. */
  status: 'completed';
  /** The fingerprint stored with the record. */
  fingerprint: string;
  /** The stored response. */
  response: StoredResponse;
}
/** What `acquire` answers: the key is now the caller's, held by another owner, or completed. */
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
  /**
   * Records one step's result under the token's in-progress record, in one atomic step: `value` (the engine's
   * encoding of the result, a string of up to the engine's size limit) stored under `name`, replacing a value
   * already stored under that name. Only while the token owns a live lease: otherwise `false`, nothing written
   * (the engine stops the execution: another may own the key). A rejection is a store failure.
   *
   * From its first step on, a record carries steps, which changes three things:
   * - `release` and a lease that runs out no longer remove it: it becomes `released` (free for the next
   *   `acquire`), keeping its fingerprint and steps;
   * - `acquire` of a released record (or of one whose lease ran out) takes it with a new token and lease, keeps its
   *   fingerprint and steps, and answers `acquired` with both (`steps`, `fingerprint`);
   * - it is kept until `ttlMs` after its latest `recordStep` (or its lease's end, whichever is later), and then
   *   is gone as any expired record (a later `acquire` starts afresh).
   * `complete` drops the steps: a completed record holds only its response. Steps live in the record's own key
   * (a Redis Cluster sees no cross-slot operation). Optional: without it, `step()` is refused with an error that
   * names the store.
   */
  recordStep?(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean>;
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
   * in which case nothing the handler wrote survived either, or with `CommitOutcomeUnknownError` if the COMMIT got
   * no answer (it may have committed: the HTTP answer is then a 503 that a retry resolves). On `false` the runtime
   * reports the key as fenced
   * (`onFenced`) and rejects with an error saying nothing was committed: a consumer settles it as a failure
   * (the message is retried), and `PostgresStore.transaction()` rejects with it.
   */
  commit(response: StoredResponse, ttlMs: number): Promise<boolean>;
  /** Rolls everything back: the record and the handler's writes. */
  rollback(): Promise<void>;
}

/** `acquireInTransaction` took the key: the record is written in an open transaction the caller now owns. */
export interface TransactionAcquiredResult {
  /** The caller owns the key. */
  status: 'acquired';
  /** The owner's token. */
  token: string;
  /** The open transaction holding the key, which the handler's writes join. */
  transaction: StoreTransaction;
  /**
   * Set when the record taken over carried steps a non-transactional attempt recorded: they are not resumed (steps
   * in a transaction stay in the attempt's memory), only reported with the record's kept `fingerprint`.
   */
  steps?: RecordedSteps;
  /**
   * With `steps`: the fingerprint the record kept, for the engine to compare; on a mismatch it rolls the
   * transaction back, which leaves the record as it was.
   */
  fingerprint?: string;
}

/** A store that can also run executions inside a transaction (`transactional: true`). */
export interface TransactionalIdempotencyStore extends IdempotencyStore {
  /**
   * Like `acquire`, but opens a transaction and writes the in-progress record in it: the key is held while the
   * transaction is open, and `commit` stores the response with the handler's writes.
   */
  acquireInTransaction(
    key: string,
    options: AcquireOptions,
  ): Promise<TransactionAcquiredResult | InProgressResult | CompletedResult>;
}
