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
import { hold } from './client';
import type { PostgresStore } from './store';

/** Where completed records are copied to and read from first: a `RedisStore` fits. */
export interface CompletedRecordCache {
  get(key: string): Promise<IdempotencyRecord | undefined>;
  /** Writes the copy unless one is already there; resolves `true` if it wrote. */
  putCompleted(
    key: string,
    record: { fingerprint: string; response: StoredResponse },
    ttlMs: number,
  ): Promise<boolean>;
}

export interface OutboxRelayOptions {
  /** The source of truth; created with `outbox: true` so that completions are queued. */
  store: PostgresStore;
  /** The cache the completions are copied to. */
  cache: CompletedRecordCache;
  /** Completions claimed per transaction. Default: `100`. */
  batchSize?: number;
  /** Pause between runs when the outbox was empty (a full batch runs again at once). Default: `'1s'`. */
  interval?: Duration;
  /** Called with a failed run; the relay keeps going. Default: ignored. */
  onError?: (error: unknown) => void;
}

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
  readonly #store: PostgresStore;
  readonly #cache: CompletedRecordCache;
  readonly #batchSize: number;
  readonly #intervalMs: number;
  readonly #onError: (error: unknown) => void;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = true;

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
    const held = await hold(this.#store.pool);
    const { client } = held;
    let broken: unknown;
    try {
      await client.query('BEGIN');
      const { rows } = await client.query<{
        id: string;
        key: string;
        fingerprint: string | null;
        status: number | null;
        headers: StoredResponse['headers'] | null;
        body: Buffer | null;
        ttl_ms: string | null;
      }>(sql.claimOutbox, [this.#batchSize]);
      const copied: string[] = [];
      for (const row of rows) {
        // No live completed record (expired, purged, or released since): nothing to copy.
        if (row.fingerprint === null || row.ttl_ms === null || Number(row.ttl_ms) <= 0) continue;
        const response = {
          status: Number(row.status),
          headers: row.headers ?? {},
          body: row.body ?? Buffer.alloc(0),
        };
        if (
          await this.#cache.putCompleted(
            row.key,
            { fingerprint: row.fingerprint, response },
            Number(row.ttl_ms),
          )
        ) {
          copied.push(row.key);
        }
      }
      if (rows.length > 0) await client.query(sql.deleteOutbox, [rows.map((row) => row.id)]);
      await client.query('COMMIT');
      return { claimed: rows.length, copied };
    } catch (error) {
      broken = error;
      if (!held.broken(error)) await client.query('ROLLBACK').catch(() => {});
      throw error;
    } finally {
      held.release(broken);
    }
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

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    await this.#running;
  }
}

/**
 * PostgreSQL as the source of truth with a cache in front: replays are read from the cache first (one Redis round
 * trip) and from PostgreSQL on a miss; every write — acquire, complete, release, renew, transactions — goes to
 * PostgreSQL, and an `OutboxRelay` fills the cache.
 */
export class CachedStore implements TransactionalIdempotencyStore {
  readonly #cache: CompletedRecordCache;
  readonly #source: PostgresStore;

  constructor(options: { cache: CompletedRecordCache; source: PostgresStore }) {
    this.#cache = options.cache;
    this.#source = options.source;
  }

  async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    return (await this.#cached(key)) ?? this.#source.acquire(key, options);
  }

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
