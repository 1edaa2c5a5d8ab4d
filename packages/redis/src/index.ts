import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import {
  type AcquireOptions,
  type AcquireResult,
  type Duration,
  type IdempotencyRecord,
  type IdempotencyStore,
  parseDuration,
  type StoredResponse,
  undoAcquire,
} from '@oncely/core';
import { autoPipelinesScriptsOnCluster, ioredisConnection, isIoredis } from './clients/ioredis';
import { isNodeRedis, isNodeRedis5OrLater, nodeRedisConnection } from './clients/node-redis';
import type { RedisConnection, ScriptArgument } from './clients/types';
import { completedRecord, parseAcquire, parseFlag, parseGet, parseReserve } from './replies';
import { SCRIPTS, type Script } from './scripts';

/**
 * An ioredis client, 5 or 6: `new Redis(url)` or `new Cluster(nodes)`. Described by shape, so that a node-redis
 * user needs no ioredis types (and the other way round).
 */
export interface IoredisClient {
  callBuffer(...args: never[]): unknown;
  duplicate(...args: never[]): unknown;
}

/** A node-redis client, `redis` 5 or 6: `createClient()` or `createCluster()`, connected (`await client.connect()`). */
export interface NodeRedisClient {
  sendCommand(...args: never[]): Promise<unknown>;
  duplicate(...args: never[]): unknown;
  withTypeMapping(...args: never[]): unknown;
  readonly isOpen: boolean;
}

export interface RedisStoreOptions {
  /**
   * The client you already have, owned by you: the store neither connects nor quits it. ioredis (`Redis` or
   * `Cluster`, 5 or 6) or node-redis (`createClient()` or `createCluster()`, `redis` 5 or 6), detected from the
   * client itself. For outages to fail fast, give it a command timeout and no offline queue (docs/stores/redis.md
   * has the settings for each client).
   */
  client: IoredisClient | NodeRedisClient;
  /** Prepended to every record key and to the wake-up channel. Default: `'oncely:'`. */
  prefix?: string;
  /**
   * Send the commands of one event-loop turn in one socket write: the first command of a turn corks the client's
   * connection and `setImmediate` uncorks it, as node-redis does. Each write to a loopback or LAN socket is a
   * system call that wakes Redis; under load, many requests' commands then share one (docs/stores/redis.md has
   * the measurements). It holds the client's other commands of that turn too, by well under a millisecond.
   * ioredis clients: a `Cluster`'s connections are corked all together (each node gets one write per turn);
   * node-redis does this by itself. Default: `true`.
   */
  coalesceWrites?: boolean;
  /**
   * Confirm each reservation and each completion on `replicas` replicas (`WAIT`, sent in the same socket write as
   * the script call) before the engine acts on it, so that a failover cannot lose them: Redis replicates
   * asynchronously, and a promoted replica without them would let a retry run the handler again
   * (docs/stores/redis.md, "Failover"). Fewer confirmations within `timeout`: a reservation fails as a store error
   * (503, fail-closed, the lease released); a completion's response is still sent, and the store error is logged
   * and reported (`onStoreError`). Keep `timeout` below the client's command timeout, and run at least
   * `replicas + 1` replicas: after a failover the promoted one is a replica less, and with too few every reservation
   * fails. Standalone and Sentinel (ioredis) clients; refused with a Cluster. Default: off.
   */
  waitForReplicas?: { replicas: number; timeout: Duration };
}

/**
 * Fewer replicas than `waitForReplicas.replicas` confirmed a reservation or a completion within its timeout. On
 * `complete`, `recordWritten` is true: the primary has the record, and only a failover before it replicates can
 * lose it.
 */
export class RedisReplicationError extends Error {
  override readonly name = 'RedisReplicationError';
  constructor(
    readonly operation: 'acquire' | 'complete',
    readonly confirmed: number,
    readonly wanted: number,
    readonly recordWritten: boolean,
  ) {
    super(
      `oncely/redis: ${confirmed} of ${wanted} replica(s) confirmed the ${operation === 'acquire' ? 'reservation' : 'completion'} in time${
        recordWritten
          ? '; the response is stored on the primary, but a failover before it replicates would lose it'
          : '; the reservation was released, nothing ran'
      }.`,
    );
  }
}

/**
 * A store on Redis (standalone or Cluster, through ioredis or node-redis). A record is one string (`scripts.ts`
 * has the layout, and how records of the earlier hash layout are still read). Each step is one command: acquire a
 * `SET ... NX GET` where the key is free or completed (the acquire script where a lease holds it), the others a Lua
 * script call. A replay costs one round trip, a first execution two (acquire, complete) plus a renewal per third
 * of `lockTimeout` while the handler runs. Scripts are sent by SHA and loaded on first use (or after a restart:
 * NOSCRIPT falls back to EVAL, which caches).
 */
export class RedisStore implements IdempotencyStore {
  readonly #connection: RedisConnection;
  readonly #prefix: string;
  readonly #channel: string;
  #subscription: { ready: Promise<void>; close(): void } | undefined;
  #subscribed: Promise<void> | undefined;
  readonly #waiters = new Map<string, Set<() => void>>();
  #closed = false;
  readonly #coalesce: boolean;
  readonly #replication: { replicas: number; timeoutMs: number } | undefined;
  #pendingConfirmation: Promise<number> | undefined;
  /**
   * Whether acquire tries `SET ... NX GET` first. Not with `waitForReplicas`: the turn's WAIT goes out right behind
   * the SET, and a script sent after it (a lease found, a refused SET) would wait for the replicas before running,
   * so a 409 would take the whole WAIT timeout. False too once the server refused the SET as a syntax error (Redis
   * before 7.0).
   */
  #reserveWithSet: boolean;
  /** The connections corked in this event-loop turn (one, or a Cluster's), until `setImmediate` uncorks them. */
  #corked: readonly Socket[] | undefined;
  readonly #uncork = (): void => {
    const streams = this.#corked;
    this.#corked = undefined;
    if (streams !== undefined) for (const stream of streams) stream.uncork();
  };

  constructor(options: RedisStoreOptions) {
    if (options === null || typeof options !== 'object' || options.client === undefined) {
      throw new TypeError(
        'oncely/redis: option "client" is required: new RedisStore({ client: new Redis(url) }) with ioredis, or new RedisStore({ client: await createClient({ url }).connect() }) with node-redis.',
      );
    }
    this.#connection = connectionFor(options.client);
    const prefix = options.prefix ?? 'oncely:';
    if (typeof prefix !== 'string') throw new TypeError('oncely/redis: option "prefix" must be a string.');
    const coalesce = options.coalesceWrites ?? true;
    if (typeof coalesce !== 'boolean')
      throw new TypeError('oncely/redis: option "coalesceWrites" must be true or false.');
    this.#prefix = prefix;
    this.#channel = `${prefix}completed`;
    this.#coalesce = coalesce;
    this.#replication = checkWaitForReplicas(options.waitForReplicas, this.#connection);
    this.#reserveWithSet = this.#replication === undefined;
  }

  async acquire(key: string, { fingerprint, lockTimeoutMs }: AcquireOptions): Promise<AcquireResult> {
    // The fencing token carries the fingerprint, which `complete` needs to build the completed record (scripts.ts).
    const token = randomUUID() + fingerprint;
    const record = `p${token}`;
    let reply: unknown;
    let confirmation: Promise<number> | undefined;
    try {
      if (this.#reserveWithSet) reply = await this.#reserve(key, record, lockTimeoutMs);
      // A live lease (its remaining time is in the script's reply only), a hash-layout record, or a server that
      // refused the SET: the script decides, atomically, as it did before the fast path.
      if (reply === undefined) {
        const args = [record, lockTimeoutMs];
        if (this.#replication === undefined) reply = await this.#run(SCRIPTS.acquire, key, args);
        else [reply, confirmation] = await this.#runConfirmed(SCRIPTS.acquire, key, args, this.#replication);
      }
    } catch (error) {
      this.#undoAcquire(key, token, lockTimeoutMs);
      throw error;
    }
    const result = parseAcquire(reply, token);
    // Only a reservation wrote anything; a replay or a conflict read what earlier writes (confirmed then) left.
    if (confirmation === undefined || result.status !== 'acquired') return result;
    let confirmed: number;
    try {
      confirmed = await confirmation;
    } catch (error) {
      this.#undoAcquire(key, token, lockTimeoutMs);
      throw error;
    }
    const wanted = (this.#replication as { replicas: number }).replicas;
    if (confirmed < wanted) {
      this.#undoAcquire(key, token, lockTimeoutMs);
      throw new RedisReplicationError('acquire', confirmed, wanted, false);
    }
    return result;
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const body = Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength);
    // Built here, not in Lua: Redis, which every app server shares, only compares the token and writes.
    const record = completedRecord(token.slice(TOKEN_ID_LENGTH), response, body);
    const args = [token, record, ttlMs, this.#channel];
    if (this.#replication === undefined) return parseFlag(await this.#run(SCRIPTS.complete, key, args));
    const { replicas } = this.#replication;
    const [reply, confirmation] = await this.#runConfirmed(SCRIPTS.complete, key, args, this.#replication);
    if (!parseFlag(reply)) return false; // fenced: nothing written
    const confirmed = await confirmation;
    if (confirmed < replicas) throw new RedisReplicationError('complete', confirmed, replicas, true);
    return true;
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
    const args = [completedRecord(fingerprint, response, body), Math.max(1, Math.floor(ttlMs))];
    return parseFlag(await this.#run(SCRIPTS.putCompleted, key, args));
  }

  async delete(key: string): Promise<boolean> {
    return (await this.#connection.del(this.#prefix + key)) === 1;
  }

  /**
   * Wakes when the key completes or is released. All waiters of this store share one subscriber connection and
   * one channel; a waiter marks the record (`w`) so that only completions someone waits for are published.
   * If the subscription cannot be made, waiters sleep until their timeout and the engine polls.
   */
  async waitFor(key: string, timeoutMs: number): Promise<void> {
    // After close(), never open a subscriber again (it would keep the process alive): sleep out the slice, as a
    // waiter without a subscription does. Returning at once would have the engine's wait loop ask again at once,
    // thousands of times a second, for as long as its wait lasts.
    if (this.#closed) {
      await new Promise<void>((resolve) => setTimeout(resolve, timeoutMs).unref());
      return;
    }
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
      // A subscriber that cannot connect must not hold the waiter past its timeout.
      const subscribed = await Promise.race([this.#subscribe().then(() => true), woken.then(() => false)]);
      // Subscribed first, then marked: a completion between the two cannot be missed.
      if (subscribed && !parseFlag(await this.#run(SCRIPTS.watch, key, []))) wake();
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
    const subscription = this.#subscription;
    this.#subscription = undefined;
    this.#subscribed = undefined;
    subscription?.close();
  }

  /**
   * The script call, and the WAIT that confirms it: resolves to the reply and to a promise of how many replicas
   * confirmed every write issued before that WAIT, this one included. One WAIT confirms every script call of an
   * event-loop turn (group confirmation): it is issued once per turn, after them, on the same connection, so it
   * follows them in order and they share one wait for the replicas (a WAIT blocks its connection until it returns:
   * one per call would queue every request behind the one before). The caller awaits the confirmation only when the
   * call wrote something, so a replay never waits for it. After a NOSCRIPT, the EVAL may go out after that WAIT, so
   * it is confirmed by the next one.
   */
  async #runConfirmed(
    script: Script,
    key: string,
    args: ScriptArgument[],
    replication: { replicas: number; timeoutMs: number },
  ): Promise<[unknown, Promise<number>]> {
    const redisKey = this.#prefix + key;
    if (this.#coalesce && this.#corked === undefined) this.#cork();
    const reply = this.#connection.evalsha(script.sha, redisKey, args);
    const confirmed = this.#confirmation(replication);
    try {
      return [await reply, confirmed];
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      const loaded = await this.#connection.eval(script.lua, redisKey, args);
      return [loaded, this.#confirmation(replication)];
    }
  }

  /**
   * Acquire's fast path, without a script: `SET key record PX lockTimeout NX GET` reserves a free key or reads a
   * completed record, in one command that costs Redis less than half of the script's CPU (docs/stores/redis.md).
   * Resolves the script's reply for those two cases, or undefined where the script must decide: a live lease (the
   * script also reports its remaining time), or an error reply (a hash-layout record's WRONGTYPE; OOM,
   * NOREPLICAS or READONLY, under which the script still answers a replay, since it only reads then). An error
   * that is not Redis's reply (a timeout, a closed connection) is thrown: the SET may have run.
   */
  async #reserve(key: string, record: string, lockTimeoutMs: number): Promise<unknown> {
    const redisKey = this.#prefix + key;
    if (this.#coalesce && this.#corked === undefined) this.#cork();
    try {
      return parseReserve(await this.#connection.reserve(redisKey, record, lockTimeoutMs));
    } catch (error) {
      if (!(error instanceof Error) || !SERVER_ERROR.test(error.message)) throw error;
      if (error.message.startsWith('ERR syntax error')) this.#reserveWithSet = false;
      return undefined;
    }
  }

  /** The WAIT of this event-loop turn, issued (once) after the turn's script calls; see `#runConfirmed`. */
  #confirmation(replication: { replicas: number; timeoutMs: number }): Promise<number> {
    let pending = this.#pendingConfirmation;
    if (pending === undefined) {
      pending = new Promise<number>((resolve, reject) => {
        // After #cork's own setImmediate (scheduled first), so the turn's scripts are written before the WAIT.
        setImmediate(() => {
          this.#pendingConfirmation = undefined;
          this.#connection.wait(replication.replicas, replication.timeoutMs).then(resolve, reject);
        });
      });
      pending.catch(() => {}); // awaited by the callers that wrote; a replay does not await it
      this.#pendingConfirmation = pending;
    }
    return pending;
  }

  /**
   * A timed-out acquire may still run once Redis answers again (a paused server, a slow network), leaving a lease
   * nobody holds that would block retries for lockTimeout. Releasing our token behind it undoes that; the token
   * fences off anyone else's record, so a release can never harm. On ioredis the release follows the acquire on
   * the same connection, which runs them in order; node-redis closes a connection that timed out, so the acquire
   * may run after a release sent on the next one: the release is tried again, at growing intervals, until one
   * removes the lease or the lease has lapsed by itself.
   */
  #undoAcquire(key: string, token: string, lockTimeoutMs: number): void {
    undoAcquire(
      async () => parseFlag(await this.#run(SCRIPTS.release, key, [token, this.#channel])),
      lockTimeoutMs,
      () => this.#closed,
    );
  }

  #subscribe(): Promise<void> {
    if (this.#subscribed !== undefined) return this.#subscribed;
    const subscription = this.#connection.subscribe(this.#channel, (redisKey) => {
      const waiters = this.#waiters.get(redisKey);
      if (waiters !== undefined) for (const wake of waiters) wake();
    });
    this.#subscription = subscription;
    this.#subscribed = subscription.ready.catch((error: unknown) => {
      // Try again on the next wait rather than never.
      if (this.#subscription === subscription) {
        this.#subscribed = undefined;
        this.#subscription = undefined;
      }
      subscription.close();
      throw error;
    });
    return this.#subscribed;
  }

  #cork(): void {
    const streams = this.#connection.corkableSockets();
    if (streams.length === 0) return;
    this.#corked = streams;
    for (const stream of streams) stream.cork();
    setImmediate(this.#uncork);
  }

  async #run(script: Script, key: string, args: ScriptArgument[]): Promise<unknown> {
    const redisKey = this.#prefix + key;
    if (this.#coalesce && this.#corked === undefined) this.#cork();
    try {
      return await this.#connection.evalsha(script.sha, redisKey, args);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      // First use on this server (or after a restart/failover): EVAL runs it and caches it for EVALSHA.
      return this.#connection.eval(script.lua, redisKey, args);
    }
  }
}

/** A `randomUUID()`: the fencing token is one followed by the fingerprint. */
const TOKEN_ID_LENGTH = 36;

/** An error reply of Redis itself: its message starts with an upper-case code (ERR, WRONGTYPE, OOM, ...). */
const SERVER_ERROR = /^[A-Z][A-Z_]+ /;

function checkWaitForReplicas(
  value: RedisStoreOptions['waitForReplicas'],
  connection: RedisConnection,
): { replicas: number; timeoutMs: number } | undefined {
  if (value === undefined) return undefined;
  const fix = "e.g. waitForReplicas: { replicas: 1, timeout: '250ms' }";
  if (value === null || typeof value !== 'object') {
    throw new TypeError(`oncely/redis: option "waitForReplicas" must be an object: ${fix}.`);
  }
  const { replicas } = value;
  if (!Number.isSafeInteger(replicas) || replicas < 1) {
    throw new TypeError(
      `oncely/redis: option "waitForReplicas.replicas" must be a whole number of at least 1: ${fix}.`,
    );
  }
  let timeoutMs: number;
  try {
    timeoutMs = parseDuration(value.timeout);
  } catch {
    throw new TypeError(`oncely/redis: option "waitForReplicas.timeout" must be a duration: ${fix}.`);
  }
  // WAIT 0 blocks for ever.
  if (!(timeoutMs >= 1)) {
    throw new TypeError(
      `oncely/redis: option "waitForReplicas.timeout" must be at least 1ms (WAIT with 0 never returns): ${fix}.`,
    );
  }
  if (connection.cluster) {
    throw new TypeError(
      'oncely/redis: option "waitForReplicas" needs a standalone or Sentinel client: with a Cluster client, WAIT cannot be sent on the connection that wrote the record.',
    );
  }
  return { replicas, timeoutMs: Math.ceil(timeoutMs) };
}

function connectionFor(client: object): RedisConnection {
  if (client === null || typeof client !== 'object') {
    throw new TypeError('oncely/redis: option "client" must be an ioredis or node-redis client.');
  }
  if (isIoredis(client)) {
    if (autoPipelinesScriptsOnCluster(client)) {
      throw new TypeError(
        `oncely/redis: option "client" is an ioredis Cluster with enableAutoPipelining, which sends a script call to the slot of the script's SHA instead of its key, so every call of the store would fail. Leave EVALSHA and EVAL out of auto-pipelining: new Cluster(nodes, { enableAutoPipelining: true, autoPipeliningIgnoredCommands: ['evalsha', 'eval'] }), or turn it off (coalesceWrites, on by default, already sends one write per node per event-loop turn).`,
      );
    }
    return ioredisConnection(client);
  }
  if (typeof (client as { getMasterNode?: unknown }).getMasterNode === 'function') {
    throw new TypeError(
      'oncely/redis: option "client" is a node-redis Sentinel client (createSentinel()), which RedisStore does not support yet: its commands take other arguments, and its pool cannot promise that WAIT follows the write it confirms. Use ioredis with Sentinel: new Redis({ sentinels, name }).',
    );
  }
  if (isNodeRedis(client)) {
    if (!isNodeRedis5OrLater(client)) {
      throw new TypeError(
        'oncely/redis: option "client" is a node-redis 4 client; RedisStore supports node-redis (the `redis` package) 5 and 6: upgrade it, or pass an ioredis client.',
      );
    }
    return nodeRedisConnection(client);
  }
  throw new TypeError(
    'oncely/redis: option "client" must be an ioredis Redis or Cluster (5 or 6), or a node-redis client or cluster (createClient() / createCluster(), redis 5 or 6).',
  );
}
