/** A response as a store keeps it: status, the headers worth replaying, and the body bytes. */
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
 * The atomic steps a store implements (`storeContractSuite` in @oncely/testing checks them). Stores hold no
 * policy: the engine decides what to do with each result. Every method is one atomic operation, and one round trip
 * on a networked store.
 *
 * Ownership: a token owns its record from `acquire` until the record completes, is released, or its lease
 * (`lockExpiresAt`) runs out. `complete`, `release` and `renew` resolve to `true` only while the token owns the
 * record, so an owner whose lease expired — and may have been taken over — can never overwrite or delete it.
 */
export interface IdempotencyStore {
  acquire(key: string, options: AcquireOptions): Promise<AcquireResult>;
  complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean>;
  release(key: string, token: string): Promise<boolean>;
  renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean>;
  /** The live record under `key`, if any. */
  get?(key: string): Promise<IdempotencyRecord | undefined>;
  /** Removes the record under `key` whatever its state (an operator's tool, not used by the engine). */
  delete?(key: string): Promise<boolean>;
  /**
   * Resolves once `key` is no longer held by a live lease (completed, released or gone), or after `timeoutMs`,
   * whichever comes first; resolves at once if the key is not held now. Lets wait mode wake on completion
   * instead of polling. Optional: the engine polls with backoff when a store lacks it.
   */
  waitFor?(key: string, timeoutMs: number): Promise<void>;
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
   * Writes the completed record and commits. Resolves `true` once committed; rejects if the commit failed, in
   * which case nothing the handler wrote survived.
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
