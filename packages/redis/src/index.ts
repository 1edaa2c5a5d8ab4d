/**
 * A store on Redis for oncely: {@link RedisStore}, on an ioredis or node-redis client, standalone or Cluster, with
 * fencing tokens and, optionally, writes confirmed on replicas (`waitForReplicas`).
 *
 * @module @oncely/redis
 */
import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import {
  type AcquireResult,
  type Duration,
  IdempotencyOptionsError,
  type IdempotencyStore,
  OncelyError,
  parseDuration,
  type StoredResponse,
} from '@oncely/core';
import { type AcquireOptions, type IdempotencyRecord, undoAcquire } from '@oncely/core/adapter';
import { autoPipelinesScriptsOnCluster, ioredisConnection, isIoredis } from './clients/ioredis';
import { isNodeRedis, isNodeRedis5OrLater, nodeRedisConnection } from './clients/node-redis';
import type { RedisConnection, ScriptArgument } from './clients/types';
import { channelOf, DEFAULT_PREFIX, redisKeyOf, usesDigestTags } from './records';
import { completedRecord, parseAcquire, parseFlag, parseGet, parseReserve, TOKEN_ID_LENGTH } from './replies';
import { SCRIPTS, type Script } from './scripts';

/**
 * An ioredis client, 5 or 6: `new Redis(url)` or `new Cluster(nodes)`. Described by shape, so that a node-redis
 * user needs no ioredis types (and the other way round).
 */
export interface IoredisClient {
  /** Sends a command and resolves with its reply, bulk strings as Buffers: how the store sends its commands. */
  callBuffer(...args: never[]): unknown;
  /** Makes a new connection with the same settings: for the store's wake-up subscription and re-sent writes. */
  duplicate(...args: never[]): unknown;
}

/** A node-redis client, `redis` 5 or 6: `createClient()` or `createCluster()`, connected (`await client.connect()`). */
export interface NodeRedisClient {
  /** Sends a raw command and resolves with its reply: how the store sends its commands. */
  sendCommand(...args: never[]): Promise<unknown>;
  /** Makes a new client with the same settings: for the store's wake-up subscription and re-sent writes. */
  duplicate(...args: never[]): unknown;
  /** Present from node-redis 5 on: how the store tells it from node-redis 4, which it refuses. */
  withTypeMapping(...args: never[]): unknown;
  /** Whether `connect()` was called and the client not closed since; connect it before the store uses it. */
  readonly isOpen: boolean;
}

/** Options of {@link RedisStore}: the client to use, and how records are keyed, written and confirmed. */
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
   * (docs/stores/redis.md, "Failover"). Releases and recorded steps (`recordStep`) are confirmed too. Fewer confirmations within `timeout`: a
   * reservation fails as a store error (503, fail-closed, the lease released); a completion's response is still
   * sent, the store error is logged and reported (`onStoreError`, `onUnconfirmedWrite`), and the store re-sends the
   * completion (or release) in the background until it is confirmed, for up to `lockTimeout`, so that a promoted
   * replica that lacks it still gets it (on a connection of the store's own, made with `duplicate()` while re-sends
   * are pending, so that their WAITs never hold yours). Keep `timeout` below the client's command timeout, and run at least
   * `replicas + 1` replicas: after a failover the promoted one is a replica less, and with too few every reservation
   * fails. Standalone and Sentinel (ioredis) clients; refused with a Cluster. Default: off.
   */
  waitForReplicas?: {
    /** How many replicas must confirm each write (a positive integer). */
    replicas: number;
    /** How long to wait for their confirmations (`WAIT`'s timeout), at least 1 ms: milliseconds, or e.g. `'50ms'`. */
    timeout: Duration;
  };
}

/**
 * How the re-sending of an unconfirmed completion or release ended (see `RedisReplicationError.confirmation`):
 * `'confirmed'` by a WAIT; `'lost'`, the key is no longer this owner's (another's lease or record is there, or, for a
 * completion within its TTL, nothing is); `'expired'`, a completion's TTL, counted from its first write, ran out before
 * a WAIT confirmed it (a retry would run again by then anyway); `'gave_up'`, the bound ran out or the store was closed.
 */
export type RedisConfirmationOutcome = 'confirmed' | 'lost' | 'expired' | 'gave_up';

/**
 * Fewer replicas than `waitForReplicas.replicas` confirmed a reservation, a completion, a release or a recorded step
 * within its timeout (a step's is on the primary, `recordWritten` true, and not re-sent: the handler stops). On `complete` and `release`, `recordWritten` is true when the primary has the write, false when the call
 * failed without a reply (`cause`: a dropped connection, a timeout, a failover under way), so that it may or may not
 * have run; either way the store re-sends it in the background until a `WAIT` confirms it (`confirmation` resolves
 * `'confirmed'`), the key is no longer this owner's (`'lost'`), a completion's TTL runs out (`'expired'`), or the
 * bound runs out (the longest `lockTimeout` after the write) or the store is closed (`'gave_up'`, after close()'s
 * last chance).
 */
export class RedisReplicationError extends OncelyError {
  /** Always `'RedisReplicationError'`. */
  override readonly name = 'RedisReplicationError';
  /** Made by the store when too few replicas confirm a write; the arguments are the properties of the same names. */
  constructor(
    /** The write too few replicas confirmed: a reservation, a completion, a release or a recorded step. */
    readonly operation: 'acquire' | 'complete' | 'release' | 'recordStep',
    /** How many replicas confirmed it within the timeout. */
    readonly confirmed: number,
    /** How many were wanted: `waitForReplicas.replicas`. */
    readonly wanted: number,
    /** Whether the primary has the write; `false` when the call failed with no reply (it may or may not have run). */
    readonly recordWritten: boolean,
    /** On `complete` and `release`: how the re-sending ended. Never rejects. */
    readonly confirmation?: Promise<RedisConfirmationOutcome>,
    /** `step`: on `recordStep`, the step's name. */
    options?: { cause?: unknown; step?: string },
  ) {
    const what =
      operation === 'acquire' ? 'reservation' : operation === 'complete' ? 'completion' : 'release';
    super(
      operation === 'acquire'
        ? `oncely/redis: ${confirmed} of ${wanted} replica(s) confirmed the reservation in time; the reservation was released, nothing ran.`
        : operation === 'recordStep'
          ? `oncely/redis: ${confirmed} of ${wanted} replica(s) confirmed step "${options?.step ?? ''}" in time; it is on the primary, so a retry replays it, unless a failover loses it first (then the retry runs it again: pass keyFor() to the foreign call it makes). Check the replicas' lag and waitForReplicas.timeout.`
          : recordWritten
            ? `oncely/redis: ${confirmed} of ${wanted} replica(s) confirmed the ${what} in time; it is on the primary, and re-sent until replicas confirm it.`
            : `oncely/redis: the ${what} failed without a reply (${(options?.cause as Error | undefined)?.message ?? 'unknown'}); it is re-sent until replicas confirm it.`,
      options,
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
  /**
   * Whether a store key holding a brace gets a digest tag of its own (`#redisKey`): on a Cluster client only, and
   * not when the prefix holds a whole hash tag (`{...}`), which then picks the slot of every key on purpose.
   */
  readonly #digestTags: boolean;
  readonly #channel: string;
  #subscription: { ready: Promise<void>; close(): void } | undefined;
  #subscribed: Promise<void> | undefined;
  readonly #waiters = new Map<string, Set<() => void>>();
  #closed = false;
  readonly #coalesce: boolean;
  readonly #replication: { replicas: number; timeoutMs: number } | undefined;
  #pendingConfirmation: Promise<number> | undefined;
  /** The unconfirmed writes being re-sent, all in the same rounds (`#resendUnconfirmed`). */
  readonly #unconfirmed = new Set<UnconfirmedWrite>();
  /** The loop that re-sends them, while there are any. */
  #resending: Promise<void> | undefined;
  /** Ends the loop's pause early (close()). */
  #wakeResending: (() => void) | undefined;
  /** After close(): when the re-sending gives up on what is still unconfirmed (performance.now()). */
  #closeBy: number | undefined;
  /**
   * The longest lease this store has reserved with: how long an unconfirmed completion or release is re-sent. A
   * promoted replica can hold the write's lease no longer than that after the write, so past it a re-send could not
   * land where a retry would find it.
   */
  #longestLeaseMs = 0;
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

  /**
   * Makes a store on `options.client`, which stays yours: the store neither connects nor quits it.
   * Throws `IdempotencyOptionsError` when an option is missing or wrong.
   */
  constructor(options: RedisStoreOptions) {
    if (options === null || typeof options !== 'object' || options.client === undefined) {
      throw new IdempotencyOptionsError(
        'client',
        'is required: new RedisStore({ client: new Redis(url) }) with ioredis, or new RedisStore({ client: await createClient({ url }).connect() }) with node-redis.',
        'oncely/redis',
      );
    }
    this.#connection = connectionFor(options.client);
    const prefix = options.prefix ?? DEFAULT_PREFIX;
    if (typeof prefix !== 'string')
      throw new IdempotencyOptionsError('prefix', 'must be a string.', 'oncely/redis');
    const coalesce = options.coalesceWrites ?? true;
    if (typeof coalesce !== 'boolean')
      throw new IdempotencyOptionsError('coalesceWrites', 'must be true or false.', 'oncely/redis');
    const open = prefix.indexOf('{');
    // Redis ignores an empty `{}` and hashes the whole key, but cluster-key-slot (ioredis, node-redis) reads on to
    // the next tag: the client would send to one slot and the server answer MOVED for another.
    if (open >= 0 && prefix[open + 1] === '}') {
      throw new IdempotencyOptionsError(
        'prefix',
        `(${JSON.stringify(prefix)}) holds an empty hash tag "{}", which Redis Cluster and its clients hash differently; put a name in it ("{myapp}:") or leave the braces out.`,
        'oncely/redis',
      );
    }
    this.#prefix = prefix;
    this.#digestTags = usesDigestTags(prefix, this.#connection.cluster);
    this.#channel = channelOf(prefix);
    this.#coalesce = coalesce;
    this.#replication = checkWaitForReplicas(options.waitForReplicas, this.#connection);
    this.#reserveWithSet = this.#replication === undefined;
  }

  async acquire(key: string, { fingerprint, lockTimeoutMs }: AcquireOptions): Promise<AcquireResult> {
    // The fencing token carries the fingerprint, which `complete` needs to build the completed record (scripts.ts).
    const token = randomUUID() + fingerprint;
    const record = `p${token}`;
    if (lockTimeoutMs > this.#longestLeaseMs) this.#longestLeaseMs = lockTimeoutMs;
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
    // Re-sent, the record keeps the TTL counted from this first write: it never outlives `ttlMs` by the re-sending.
    const firstWrite = performance.now();
    return this.#writeConfirmed('complete', SCRIPTS.complete, key, args, this.#replication, {
      script: SCRIPTS.recomplete,
      args: () => [
        token,
        record,
        Math.max(1, Math.floor(firstWrite + ttlMs - performance.now())),
        this.#channel,
      ],
      expires: firstWrite + ttlMs,
    });
  }

  async release(key: string, token: string): Promise<boolean> {
    const args = [token, this.#channel];
    if (this.#replication === undefined) return parseFlag(await this.#run(SCRIPTS.release, key, args));
    return this.#writeConfirmed('release', SCRIPTS.release, key, args, this.#replication, {
      script: SCRIPTS.rerelease,
      args: () => args,
    });
  }

  /**
   * One script call. With `waitForReplicas`, the step is confirmed by the turn's WAIT, as a completion is, before it
   * resolves `true`: a promoted replica without it would let the retry run the step again. Fewer confirmations in
   * time reject with a `RedisReplicationError` (`recordWritten: true`, not re-sent): the step is on the primary and
   * the handler stops with a store error; a retry replays the step unless a failover lost it first.
   */
  async recordStep(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean> {
    const args = [token, name, value, ttlMs];
    const replication = this.#replication;
    if (replication === undefined) return parseFlag(await this.#run(SCRIPTS.recordStep, key, args));
    const [reply, confirmation] = await this.#runConfirmed(SCRIPTS.recordStep, key, args, replication);
    if (!parseFlag(reply)) return false; // fenced: nothing written
    const confirmed = await confirmation.catch(() => 0);
    if (confirmed >= replication.replicas) return true;
    throw new RedisReplicationError('recordStep', confirmed, replication.replicas, true, undefined, {
      step: name,
    });
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
    return (await this.#connection.del(this.#redisKey(key))) === 1;
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
    const redisKey = this.#redisKey(key);
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

  /**
   * Closes the store's own connections; the client you passed in stays yours to quit. Unconfirmed writes still being
   * re-sent (`waitForReplicas`) get a last chance first: close() re-sends them at once and waits for their WAIT, up
   * to 1 s (or twice the WAIT timeout, if longer); what is still unconfirmed then ends as `'gave_up'`.
   */
  async close(): Promise<void> {
    this.#closed = true;
    for (const waiters of this.#waiters.values()) for (const wake of waiters) wake();
    const subscription = this.#subscription;
    this.#subscription = undefined;
    this.#subscribed = undefined;
    subscription?.close();
    if (this.#closeBy === undefined) {
      const timeoutMs = this.#replication?.timeoutMs ?? 0;
      this.#closeBy = performance.now() + Math.max(CLOSE_GRACE_MS, 2 * timeoutMs);
    }
    while (this.#resending !== undefined) {
      this.#wakeResending?.();
      await this.#resending;
    }
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
    const redisKey = this.#redisKey(key);
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
   * A completion or a release, confirmed by the turn's WAIT. Resolves false if fenced (nothing written), true once
   * confirmed. Written but not confirmed in time (the replicas lag, or a partition cut them off), or failed without
   * a reply: the write stays with its execution, since it is all a promoted replica would lack. It throws a
   * `RedisReplicationError` (the engine still answers: the response was in hand) whose `confirmation` is the
   * re-sending, in the background, of the same write for the same token (`resend`, which also accepts the write
   * already done) until a WAIT confirms it.
   */
  async #writeConfirmed(
    operation: 'complete' | 'release',
    script: Script,
    key: string,
    args: ScriptArgument[],
    replication: { replicas: number; timeoutMs: number },
    resend: Omit<UnconfirmedWrite, 'key' | 'until' | 'settle'>,
  ): Promise<boolean> {
    let reply: unknown;
    let confirmation: Promise<number>;
    try {
      [reply, confirmation] = await this.#runConfirmed(script, key, args, replication);
    } catch (error) {
      // No reply (a dropped connection, a timeout, a failover under way, a node no longer primary): the write may
      // have run or not. The re-send takes either state, and the lease is still this owner's on whichever node
      // will be primary.
      const resending = this.#resend(key, resend, replication);
      throw new RedisReplicationError(operation, 0, replication.replicas, false, resending, { cause: error });
    }
    if (!parseFlag(reply)) return false; // fenced: nothing written
    // A WAIT that failed (its connection dropped) confirmed nothing either.
    const confirmed = await confirmation.catch(() => 0);
    if (confirmed >= replication.replicas) return true;
    const resending = this.#resend(key, resend, replication);
    throw new RedisReplicationError(operation, confirmed, replication.replicas, true, resending);
  }

  /**
   * Re-sends an unconfirmed write in the background until a WAIT confirms it, the script finds the key no longer
   * this owner's, a completion's TTL runs out, or the longest lease has passed (or the store was closed and its
   * last chance is over). A promoted replica can hold the write's lease no longer than that lease, so past it a
   * re-send could not land where a retry would find it.
   */
  #resend(
    key: string,
    write: Omit<UnconfirmedWrite, 'key' | 'until' | 'settle'>,
    replication: { replicas: number; timeoutMs: number },
  ): Promise<RedisConfirmationOutcome> {
    return new Promise<RedisConfirmationOutcome>((resolve) => {
      const unconfirmed: UnconfirmedWrite = {
        ...write,
        key,
        until: performance.now() + (this.#longestLeaseMs || DEFAULT_LEASE_MS),
        settle: (outcome) => {
          if (this.#unconfirmed.delete(unconfirmed)) resolve(outcome);
        },
      };
      this.#unconfirmed.add(unconfirmed);
      this.#startResending(replication);
    });
  }

  #startResending(replication: { replicas: number; timeoutMs: number }): void {
    if (this.#resending !== undefined) return;
    this.#resending = this.#resendUnconfirmed(replication)
      .catch(() => {
        // A connection that could not even be made (the client refused to duplicate): nothing can confirm them.
        for (const write of this.#unconfirmed) write.settle('gave_up');
      })
      .then(() => {
        this.#resending = undefined;
        // A write added while the loop was ending.
        if (this.#unconfirmed.size > 0) this.#startResending(replication);
      });
  }

  /**
   * The store-wide re-sending: every pending write is tried in the same round, at growing intervals (0.1 s, 0.2 s...
   * up to 1 s), followed by one WAIT that confirms them all. Rounds go out on a connection of the store's own, opened
   * while writes are pending and closed after, so that their WAITs never hold the user's connection (a WAIT blocks its
   * connection until it returns). One round at a time: a write has at most one try in flight, and a round without an
   * answer (a hung node, a half-open connection) has its connection closed, freeing what it held, and the next round
   * opens another, which follows a failover as the user's client does. A failed try is tried again: once the
   * connection follows the failover, the re-send lands on the promoted node, where this token's lease still holds
   * the key.
   */
  async #resendUnconfirmed(replication: { replicas: number; timeoutMs: number }): Promise<void> {
    let side: SideConnection | undefined;
    let round: { started: number; side: SideConnection } | undefined;
    let delayMs = RESEND_FIRST_DELAY_MS;
    try {
      while (this.#unconfirmed.size > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(wake, this.#closeBy === undefined ? delayMs : RESEND_FIRST_DELAY_MS);
          timer.unref();
          function wake() {
            clearTimeout(timer);
            resolve();
          }
          this.#wakeResending = wake;
        });
        this.#wakeResending = undefined;
        delayMs = Math.min(delayMs * 2, RESEND_MAX_DELAY_MS);
        const now = performance.now();
        for (const write of this.#unconfirmed) {
          if (write.expires !== undefined && now >= write.expires) write.settle('expired');
          else if (now >= write.until || (this.#closeBy !== undefined && now >= this.#closeBy))
            write.settle('gave_up');
        }
        if (this.#unconfirmed.size === 0) break;
        if (round !== undefined) {
          if (now - round.started < replication.timeoutMs + ROUND_BOUND_MS) continue;
          // No answer for that long: drop the connection and what it holds in flight; the next round opens another.
          round.side.close();
          if (side === round.side) side = undefined;
          round = undefined;
        }
        side ??= this.#connection.sideConnection();
        const current = { started: now, side };
        round = current;
        const ended = (failed: boolean) => {
          // A try or a WAIT without a reply may still be queued on the connection: a new one sends no second copy.
          if (failed) {
            current.side.close();
            if (side === current.side) side = undefined;
          }
          if (round === current) round = undefined;
        };
        this.#resendRound(current.side, replication).then(ended, () => ended(true));
      }
    } finally {
      this.#wakeResending = undefined;
      side?.close();
    }
  }

  /**
   * One round: each pending write's re-send, then one WAIT, in that order on one connection, so that the WAIT
   * confirms them all. Resolves true when something got no reply (the connection is then replaced).
   */
  async #resendRound(
    side: SideConnection,
    replication: { replicas: number; timeoutMs: number },
  ): Promise<boolean> {
    try {
      await side.ready;
    } catch {
      return true;
    }
    const writes = [...this.#unconfirmed];
    if (writes.length === 0) return false;
    const tries = writes.map((write) =>
      side.connection.evalsha(write.script.sha, this.#redisKey(write.key), write.args()),
    );
    const waited = side.connection.wait(replication.replicas, replication.timeoutMs);
    waited.catch(() => {});
    const replies = await Promise.allSettled(tries);
    let failed = false;
    const written: UnconfirmedWrite[] = [];
    replies.forEach((reply, i) => {
      const write = writes[i] as UnconfirmedWrite;
      if (reply.status === 'rejected') {
        const message = reply.reason instanceof Error ? reply.reason.message : '';
        // First use on this node (a promoted replica, a restart): EVAL loads the script; the next round confirms.
        if (message.startsWith('NOSCRIPT'))
          side.connection.eval(write.script.lua, this.#redisKey(write.key), write.args()).catch(() => {});
        else if (!SERVER_ERROR.test(message)) failed = true;
        return;
      }
      if (reply.value === 1) written.push(write);
      // The key is gone: a completion whose TTL ran out (give or take the clocks of two servers) has expired.
      else if (
        reply.value === 2 &&
        write.expires !== undefined &&
        performance.now() >= write.expires - EXPIRY_SLACK_MS
      )
        write.settle('expired');
      else write.settle('lost');
    });
    let confirmed = 0;
    try {
      confirmed = await waited;
    } catch (error) {
      if (!(error instanceof Error) || !SERVER_ERROR.test(error.message)) failed = true;
    }
    if (confirmed >= replication.replicas) for (const write of written) write.settle('confirmed');
    return failed;
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
    const redisKey = this.#redisKey(key);
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
    // 'undo': a record with steps this acquire resumed keeps its own fingerprint, so its token is not this one.
    const args = [token, this.#channel, 'undo'];
    const replication = this.#replication;
    undoAcquire(
      replication === undefined
        ? async () => parseFlag(await this.#run(SCRIPTS.release, key, args))
        : // With waitForReplicas the release is confirmed too (re-sent until a WAIT confirms it): a failover must
          // not bring back the lease of a reservation that was refused.
          async () => {
            try {
              return await this.#writeConfirmed('release', SCRIPTS.release, key, args, replication, {
                script: SCRIPTS.rerelease,
                args: () => args,
              });
            } catch (error) {
              // Written, and re-sent until confirmed: done. No reply: try again, as without waitForReplicas.
              if (error instanceof RedisReplicationError && error.recordWritten) return true;
              throw error;
            }
          },
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

  /** The Redis key of a store key (`redisKeyOf`, shared with `@oncely/redis/records`). */
  #redisKey(key: string): string {
    return redisKeyOf(this.#prefix, key, this.#digestTags);
  }

  async #run(script: Script, key: string, args: ScriptArgument[]): Promise<unknown> {
    const redisKey = this.#redisKey(key);
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

/** The re-sending's bound for a store that has not reserved yet (a completion for a key another store took). */
const DEFAULT_LEASE_MS = 30_000;

/** The first and the longest pause between two re-sends of an unconfirmed write. */
const RESEND_FIRST_DELAY_MS = 100;
const RESEND_MAX_DELAY_MS = 1000;

/** How long past its WAIT's timeout a round of re-sends may go without an answer before its connection is dropped. */
const ROUND_BOUND_MS = 1000;

/** close()'s wait for the writes still being re-sent, at least. */
const CLOSE_GRACE_MS = 1000;

/** How far the clocks of two Redis servers (a failover's) may disagree on when a completion's TTL ran out. */
const EXPIRY_SLACK_MS = 1000;

/** An unconfirmed completion or release being re-sent (`#resend`). */
interface UnconfirmedWrite {
  readonly key: string;
  /** RECOMPLETE or RERELEASE. */
  readonly script: Script;
  /** Its arguments for a try now (a completion's TTL is what is left of it). */
  readonly args: () => ScriptArgument[];
  /** A completion's: when its TTL, counted from the first write, runs out (performance.now()). */
  readonly expires?: number;
  /** When the re-sending stops: the longest lease after the write. */
  readonly until: number;
  /** Ends it (once; later calls do nothing). */
  settle(outcome: RedisConfirmationOutcome): void;
}

type SideConnection = ReturnType<RedisConnection['sideConnection']>;

/** An error reply of Redis itself: its message starts with an upper-case code (ERR, WRONGTYPE, OOM, ...). */
const SERVER_ERROR = /^[A-Z][A-Z_]+ /;

function checkWaitForReplicas(
  value: RedisStoreOptions['waitForReplicas'],
  connection: RedisConnection,
): { replicas: number; timeoutMs: number } | undefined {
  if (value === undefined) return undefined;
  const fix = "e.g. waitForReplicas: { replicas: 1, timeout: '250ms' }";
  if (value === null || typeof value !== 'object') {
    throw new IdempotencyOptionsError('waitForReplicas', `must be an object: ${fix}.`, 'oncely/redis');
  }
  const { replicas } = value;
  if (!Number.isSafeInteger(replicas) || replicas < 1) {
    throw new IdempotencyOptionsError(
      'waitForReplicas.replicas',
      `must be a whole number of at least 1: ${fix}.`,
      'oncely/redis',
    );
  }
  let timeoutMs: number;
  try {
    timeoutMs = parseDuration(value.timeout);
  } catch {
    throw new IdempotencyOptionsError(
      'waitForReplicas.timeout',
      `must be a duration: ${fix}.`,
      'oncely/redis',
    );
  }
  // WAIT 0 blocks for ever.
  if (!(timeoutMs >= 1)) {
    throw new IdempotencyOptionsError(
      'waitForReplicas.timeout',
      `must be at least 1ms (WAIT with 0 never returns): ${fix}.`,
      'oncely/redis',
    );
  }
  if (connection.cluster) {
    throw new IdempotencyOptionsError(
      'waitForReplicas',
      'needs a standalone or Sentinel client: with a Cluster client, WAIT cannot be sent on the connection that wrote the record.',
      'oncely/redis',
    );
  }
  return { replicas, timeoutMs: Math.ceil(timeoutMs) };
}

function connectionFor(client: object): RedisConnection {
  if (client === null || typeof client !== 'object') {
    throw new IdempotencyOptionsError('client', 'must be an ioredis or node-redis client.', 'oncely/redis');
  }
  if (isIoredis(client)) {
    if (autoPipelinesScriptsOnCluster(client)) {
      throw new IdempotencyOptionsError(
        'client',
        `is an ioredis Cluster with enableAutoPipelining, which sends a script call to the slot of the script's SHA instead of its key, so every call of the store would fail. Leave EVALSHA and EVAL out of auto-pipelining: new Cluster(nodes, { enableAutoPipelining: true, autoPipeliningIgnoredCommands: ['evalsha', 'eval'] }), or turn it off (coalesceWrites, on by default, already sends one write per node per event-loop turn).`,
        'oncely/redis',
      );
    }
    return ioredisConnection(client);
  }
  if (typeof (client as { getMasterNode?: unknown }).getMasterNode === 'function') {
    throw new IdempotencyOptionsError(
      'client',
      'is a node-redis Sentinel client (createSentinel()), which RedisStore does not support yet: its commands take other arguments, and its pool cannot promise that WAIT follows the write it confirms. Use ioredis with Sentinel: new Redis({ sentinels, name }).',
      'oncely/redis',
    );
  }
  if (isNodeRedis(client)) {
    if (!isNodeRedis5OrLater(client)) {
      throw new IdempotencyOptionsError(
        'client',
        'is a node-redis 4 client; RedisStore supports node-redis (the `redis` package) 5 and 6: upgrade it, or pass an ioredis client.',
        'oncely/redis',
      );
    }
    return nodeRedisConnection(client);
  }
  throw new IdempotencyOptionsError(
    'client',
    'must be an ioredis Redis or Cluster (5 or 6), or a node-redis client or cluster (createClient() / createCluster(), redis 5 or 6).',
    'oncely/redis',
  );
}
