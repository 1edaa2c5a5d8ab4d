import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import type {
  AcquireOptions,
  AcquireResult,
  IdempotencyRecord,
  IdempotencyStore,
  StoredResponse,
} from '@oncely/core';
import type { Cluster, Redis } from 'ioredis';
import { parseAcquire, parseFlag, parseGet } from './replies';
import { SCRIPTS, type Script } from './scripts';

export interface RedisStoreOptions {
  /**
   * An ioredis `Redis` or `Cluster` client, owned by you: the store neither connects nor quits it. For outages
   * to fail fast, give it `commandTimeout`, a small `maxRetriesPerRequest` and `enableOfflineQueue: false`
   * (see docs/stores/redis.md).
   */
  client: Redis | Cluster;
  /** Prepended to every record key and to the wake-up channel. Default: `'oncely:'`. */
  prefix?: string;
  /**
   * Send the commands of one event-loop turn in one socket write: the first command of a turn corks the client's
   * connection and `setImmediate` uncorks it, as node-redis does. Each write to a loopback or LAN socket is a
   * system call that wakes Redis; under load, many requests' commands then share one (docs/stores/redis.md has
   * the measurements). It holds the client's other commands of that turn too, by well under a millisecond.
   * Standalone clients only (a `Cluster` has a connection per node). Default: `true`.
   */
  coalesceWrites?: boolean;
}

type Client = Redis | Cluster;
type BufferEval = Record<
  'evalshaBuffer' | 'evalBuffer',
  (script: string, keys: number, ...args: (string | number | Buffer)[]) => Promise<unknown>
>;

/**
 * A store on Redis (standalone or Cluster). Each step is one Lua script call: a replay costs one round trip, a
 * first execution two (acquire, complete) plus a renewal per third of `lockTimeout` while the handler runs.
 * Scripts are sent by SHA and loaded on first use (or after a restart: NOSCRIPT falls back to EVAL, which caches).
 */
export class RedisStore implements IdempotencyStore {
  readonly #client: Client;
  readonly #prefix: string;
  readonly #channel: string;
  #subscriber: Client | undefined;
  #subscribed: Promise<void> | undefined;
  readonly #waiters = new Map<string, Set<() => void>>();
  #closed = false;
  readonly #coalesce: boolean;
  /** The connection corked in this event-loop turn, until `setImmediate` uncorks it. */
  #corked: Socket | undefined;
  readonly #uncork = (): void => {
    const stream = this.#corked;
    this.#corked = undefined;
    stream?.uncork();
  };

  constructor(options: RedisStoreOptions) {
    if (options === null || typeof options !== 'object' || options.client === undefined) {
      throw new TypeError(
        'oncely/redis: option "client" is required: new RedisStore({ client: new Redis(url) }).',
      );
    }
    if (
      typeof (options.client as Redis).callBuffer !== 'function' ||
      typeof options.client.duplicate !== 'function'
    ) {
      throw new TypeError('oncely/redis: option "client" must be an ioredis Redis or Cluster instance.');
    }
    const prefix = options.prefix ?? 'oncely:';
    if (typeof prefix !== 'string') throw new TypeError('oncely/redis: option "prefix" must be a string.');
    const coalesce = options.coalesceWrites ?? true;
    if (typeof coalesce !== 'boolean')
      throw new TypeError('oncely/redis: option "coalesceWrites" must be true or false.');
    this.#client = options.client;
    this.#prefix = prefix;
    this.#channel = `${prefix}completed`;
    this.#coalesce = coalesce;
  }

  async acquire(key: string, { fingerprint, lockTimeoutMs }: AcquireOptions): Promise<AcquireResult> {
    const token = randomUUID();
    let reply: unknown;
    try {
      reply = await this.#run(SCRIPTS.acquire, key, [fingerprint, lockTimeoutMs, token]);
    } catch (error) {
      // A timed-out acquire may still run once Redis answers again (a paused server, a slow network), leaving a
      // lease nobody holds that would block retries for lockTimeout. Releasing our token behind it undoes that;
      // commands on one connection run in order, and the token fences off anyone else's record.
      this.#run(SCRIPTS.release, key, [token, this.#channel]).catch(() => {});
      throw error;
    }
    return parseAcquire(reply, token);
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const body = Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength);
    const headers = JSON.stringify(response.headers);
    return parseFlag(
      await this.#run(SCRIPTS.complete, key, [token, response.status, headers, body, ttlMs, this.#channel]),
    );
  }

  async release(key: string, token: string): Promise<boolean> {
    return parseFlag(await this.#run(SCRIPTS.release, key, [token, this.#channel]));
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    return parseFlag(await this.#run(SCRIPTS.renew, key, [token, lockTimeoutMs]));
  }

  async get(key: string): Promise<IdempotencyRecord | undefined> {
    return parseGet(await this.#run(SCRIPTS.get, key, []));
  }

  /**
   * Stores a completed record copied from another store (the PostgreSQL outbox relay keeps Redis as a read
   * cache this way), unless a completed record is already there. Resolves `true` if it wrote.
   */
  async putCompleted(
    key: string,
    record: { fingerprint: string; response: StoredResponse },
    ttlMs: number,
  ): Promise<boolean> {
    const { fingerprint, response } = record;
    const body = Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength);
    const args = [
      fingerprint,
      response.status,
      JSON.stringify(response.headers),
      body,
      Math.max(1, Math.floor(ttlMs)),
    ];
    return parseFlag(await this.#run(SCRIPTS.putCompleted, key, args));
  }

  async delete(key: string): Promise<boolean> {
    return (await this.#client.del(this.#prefix + key)) === 1;
  }

  /**
   * Wakes when the key completes or is released. All waiters of this store share one subscriber connection and
   * one channel; a waiter marks the record (`w`) so that only completions someone waits for are published.
   * If the subscription cannot be made, waiters sleep until their timeout and the engine polls.
   */
  async waitFor(key: string, timeoutMs: number): Promise<void> {
    // After close(), never open a subscriber again (it would keep the process alive): the engine polls instead.
    if (this.#closed) return;
    let wake!: () => void;
    const woken = new Promise<void>((resolve) => {
      wake = resolve;
    });
    const redisKey = this.#prefix + key;
    let waiters = this.#waiters.get(redisKey);
    if (waiters === undefined) {
      waiters = new Set();
      this.#waiters.set(redisKey, waiters);
    }
    waiters.add(wake);
    const timer = setTimeout(wake, timeoutMs);
    timer.unref();
    try {
      await this.#subscribe();
      // Subscribed first, then marked: a completion between the two cannot be missed.
      if (!parseFlag(await this.#run(SCRIPTS.watch, key, []))) wake();
    } catch {
      // No wake-up available: fall back to the timeout.
    }
    await woken;
    clearTimeout(timer);
    waiters.delete(wake);
    if (waiters.size === 0 && this.#waiters.get(redisKey) === waiters) this.#waiters.delete(redisKey);
  }

  /** Closes the store's own subscriber connection; the client you passed in stays yours to quit. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const waiters of this.#waiters.values()) for (const wake of waiters) wake();
    const subscriber = this.#subscriber;
    this.#subscriber = undefined;
    this.#subscribed = undefined;
    if (subscriber !== undefined) subscriber.disconnect();
  }

  #subscribe(): Promise<void> {
    if (this.#subscribed !== undefined) return this.#subscribed;
    const subscriber = this.#client.duplicate();
    // Without a listener ioredis would print every reconnection error; waiters already degrade to polling.
    subscriber.on('error', () => {});
    subscriber.on('message', (_channel: string, redisKey: string) => {
      const waiters = this.#waiters.get(redisKey);
      if (waiters !== undefined) for (const wake of waiters) wake();
    });
    this.#subscriber = subscriber;
    this.#subscribed = subscriber.subscribe(this.#channel).then(
      () => undefined,
      (error: unknown) => {
        // Try again on the next wait rather than never.
        this.#subscribed = undefined;
        this.#subscriber = undefined;
        subscriber.disconnect();
        throw error;
      },
    );
    return this.#subscribed;
  }

  #cork(): void {
    // Only a connected standalone client: while connecting, ioredis queues commands itself.
    const client = this.#client as Redis & { stream?: Socket };
    const stream = client.stream;
    if (client.status !== 'ready' || stream === undefined || typeof stream.cork !== 'function') return;
    this.#corked = stream;
    stream.cork();
    setImmediate(this.#uncork);
  }

  async #run(script: Script, key: string, args: (string | number | Buffer)[]): Promise<unknown> {
    const redisKey = this.#prefix + key;
    // evalshaBuffer/evalBuffer exist at runtime but not in ioredis' types. callBuffer('evalsha', ...) would be
    // typed, but with `enableAutoPipelining` ioredis then sends the SHA as the command name (every call fails).
    const client = this.#client as unknown as BufferEval;
    if (this.#coalesce && this.#corked === undefined) this.#cork();
    try {
      return await client.evalshaBuffer(script.sha, 1, redisKey, ...args);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      // First use on this server (or after a restart/failover): EVAL runs it and caches it for EVALSHA.
      return client.evalBuffer(script.lua, 1, redisKey, ...args);
    }
  }
}
