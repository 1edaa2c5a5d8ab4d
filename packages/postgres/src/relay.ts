import {
  type AcquireResult,
  type CompletedResult,
  type Duration,
  IdempotencyOptionsError,
  type InProgressResult,
  parseDuration,
  type StoredResponse,
} from '@oncely/core';
import type {
  AcquireOptions,
  IdempotencyRecord,
  TransactionAcquiredResult,
  TransactionalIdempotencyStore,
} from '@oncely/core/adapter';
import { toNumber, toResponse, toText } from './rows';
import type { PostgresStore } from './store';

/** Where completed records are copied to and read from first: a `RedisStore` fits. */
export interface CompletedRecordCache {
  /** The cached record of `key`, or `undefined` when the cache has none. */
  get(key: string): Promise<IdempotencyRecord | undefined>;
  /** Writes the copy unless one is already there; resolves `true` if it wrote. */
  putCompleted(
    key: string,
    record: { fingerprint: string; response: StoredResponse },
    ttlMs: number,
  ): Promise<boolean>;
}

/** Options of {@link OutboxRelay}: the outbox to read, the cache to fill, and how often. */
export interface OutboxRelayOptions {
  /** The source of truth; created with `outbox: true` so that completions are queued. */
  store: PostgresStore<unknown>;
  /** The cache the completions are copied to. */
  cache: CompletedRecordCache;
  /** Completions claimed per transaction. Default: `100`. */
  batchSize?: number;
  /** Pause between runs when the outbox was empty (a full batch runs again at once). Default: `'1s'`. */
  interval?: Duration;
  /** Called with a failed run; the relay keeps going. Default: ignored. */
  onError?: (error: unknown) => void;
}

/** What one run of an {@link OutboxRelay} did (`runOnce()`). */
export interface RelayRun {
  /** Outbox entries claimed and removed. */
  claimed: number;
  /** Keys this run wrote to the cache (keys already there, expired or gone are not written). */
  copied: string[];
}

/**
 * Copies completed records from the PostgreSQL outbox to a cache (the transactional outbox pattern). Each run
 * claims a batch with `FOR UPDATE SKIP LOCKED` inside one transaction, copies it, deletes the entries and commits:
 * several relays share the work without waiting on each other, and a relay that dies mid-batch leaves its
 * entries to the next one (its transaction rolls back). A copy is written only if the cache does not hold the
 * record yet, so a batch taken over after a crash writes nothing twice.
 */
export class OutboxRelay {
  readonly #store: PostgresStore<unknown>;
  readonly #cache: CompletedRecordCache;
  readonly #batchSize: number;
  readonly #intervalMs: number;
  readonly #onError: (error: unknown) => void;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = true;

  /**
   * Makes a relay, stopped: call `start()` to relay continuously, or `runOnce()` for one batch.
   * Throws `IdempotencyOptionsError` when `store` or `cache` is missing, the store was made without `outbox: true`,
   * or `batchSize` is not a positive integer.
   */
  constructor(options: OutboxRelayOptions) {
    for (const option of ['store', 'cache'] as const) {
      if (options?.[option] === undefined) {
        throw new IdempotencyOptionsError(
          option,
          'is required: OutboxRelay needs options "store" (a PostgresStore) and "cache" (a RedisStore).',
          'oncely/postgres',
        );
      }
    }
    // Without the outbox nothing is queued (and migrate() made no outbox table): the relay would never copy a thing.
    if (!options.store.queuesOutbox) {
      throw new IdempotencyOptionsError(
        'store',
        'must be a store created with outbox: true (new PostgresStore({ pool, outbox: true })), so that completions are queued for the OutboxRelay.',
        'oncely/postgres',
      );
    }
    this.#store = options.store;
    this.#cache = options.cache;
    this.#batchSize = options.batchSize ?? 100;
    if (!Number.isSafeInteger(this.#batchSize) || this.#batchSize < 1) {
      throw new IdempotencyOptionsError(
        'batchSize',
        `must be a positive integer; got ${JSON.stringify(options.batchSize)}.`,
        'oncely/postgres',
      );
    }
    this.#intervalMs = parseDuration(options.interval ?? '1s');
    this.#onError = options.onError ?? (() => {});
  }

  /** Relays one batch. */
  async runOnce(): Promise<RelayRun> {
    const sql = this.#store.statements;
    return this.#store.inOwnTransaction(async (query) => {
      const { rows } = await query(sql.claimOutbox, [this.#batchSize]);
      const copied: string[] = [];
      for (const row of rows) {
        const key = toText(row.key) ?? '';
        const fingerprint = toText(row.fingerprint);
        // No live completed record (expired, purged, or released since): nothing to copy.
        if (fingerprint === null || row.ttlms === null || toNumber(row.ttlms) <= 0) continue;
        if (
          await this.#cache.putCompleted(key, { fingerprint, response: toResponse(row) }, toNumber(row.ttlms))
        )
          copied.push(key);
      }
      if (rows.length > 0) await query(sql.deleteOutbox, [rows.map((row) => String(row.id))]);
      return { claimed: rows.length, copied };
    });
  }

  /** Relays continuously until `stop()`: full batches back to back, then every `interval`. */
  start(): this {
    if (!this.#stopped) return this;
    this.#stopped = false;
    const loop = async (): Promise<void> => {
      let full = false;
      try {
        full = (await this.runOnce()).claimed === this.#batchSize;
      } catch (error) {
        this.#onError(error);
      }
      if (this.#stopped) return;
      this.#timer = setTimeout(
        () => {
          this.#running = loop();
        },
        full ? 0 : this.#intervalMs,
      );
      this.#timer.unref();
    };
    this.#running = loop();
    return this;
  }

  /** Stops relaying: resolves once the run under way, if any, has finished. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    await this.#running;
  }
}

/**
 * PostgreSQL as the source of truth with a cache in front: replays are read from the cache first (one Redis round
 * trip) and from PostgreSQL on a miss; every write — acquire, complete, release, renew, steps, transactions — goes to
 * PostgreSQL, and an `OutboxRelay` fills the cache.
 */
export class CachedStore implements TransactionalIdempotencyStore {
  readonly #cache: CompletedRecordCache;
  readonly #source: PostgresStore<unknown>;

  /**
   * Makes a store that reads completed records from `cache` first, and does everything else on `source`.
   */
  constructor(options: {
    /** The cache an `OutboxRelay` fills: a `RedisStore` fits. */
    cache: CompletedRecordCache;
    /** The PostgresStore every write goes to, made with `outbox: true` so that an `OutboxRelay` fills the cache. */
    source: PostgresStore<unknown>;
  }) {
    this.#cache = options.cache;
    this.#source = options.source;
  }

  async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    return (await this.#cached(key)) ?? this.#source.acquire(key, options);
  }

  /**
   * Transactional mode: a completed record in the cache is replayed from it; otherwise the source opens the
   * transaction and reserves the key in it (see `PostgresStore.acquireInTransaction`).
   */
  async acquireInTransaction(
    key: string,
    options: AcquireOptions,
  ): Promise<TransactionAcquiredResult | InProgressResult | CompletedResult> {
    return (await this.#cached(key)) ?? this.#source.acquireInTransaction(key, options);
  }

  complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    return this.#source.complete(key, token, response, ttlMs);
  }

  release(key: string, token: string): Promise<boolean> {
    return this.#source.release(key, token);
  }

  renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    return this.#source.renew(key, token, lockTimeoutMs);
  }

  /** Steps are written to the source only: the cache holds completed records, which carry none. */
  recordStep(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean> {
    return this.#source.recordStep(key, token, name, value, ttlMs);
  }

  get(key: string): Promise<IdempotencyRecord | undefined> {
    return this.#source.get(key);
  }

  async #cached(key: string): Promise<CompletedResult | undefined> {
    let record: IdempotencyRecord | undefined;
    try {
      record = await this.#cache.get(key);
    } catch {
      return undefined; // the cache is only a shortcut: on its failure, ask the source of truth
    }
    if (record?.state !== 'completed' || record.response === undefined) return undefined;
    return { status: 'completed', fingerprint: record.fingerprint, response: record.response };
  }
}
