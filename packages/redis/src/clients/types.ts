import type { Socket } from 'node:net';

/** A script argument: numbers are sent as their decimal text. */
export type ScriptArgument = string | number | Buffer;

/**
 * What the store needs of a Redis client, one implementation per client library (`ioredis.ts`, `node-redis.ts`).
 * Replies come back in one shape whichever the client: bulk strings as Buffers, integers as numbers, nil as null,
 * arrays as arrays; `replies.ts` parses them.
 */
export interface RedisConnection {
  /** `ioredis` or `node-redis`, for error messages and docs. */
  readonly library: 'ioredis' | 'node-redis';
  /** EVALSHA with one key; rejects with an error whose message starts with `NOSCRIPT` when the script is not loaded. */
  evalsha(sha: string, key: string, args: readonly ScriptArgument[]): Promise<unknown>;
  /** EVAL with one key: runs the script and caches it for EVALSHA. */
  eval(lua: string, key: string, args: readonly ScriptArgument[]): Promise<unknown>;
  /**
   * `SET key value PX pxMs NX GET` (Redis 7.0+): reserves a free key and resolves null, or resolves the value
   * already there (a Buffer), leaving it as it is. A server error (WRONGTYPE, OOM, a syntax error before 7.0, ...)
   * rejects with Redis's own message, which starts with its upper-case code.
   */
  reserve(key: string, value: string, pxMs: number): Promise<unknown>;
  /** A Cluster client: keyless commands (WAIT) would go to any node. */
  readonly cluster: boolean;
  /**
   * WAIT: resolves to how many replicas have acknowledged every write this connection sent before it. Called in the
   * same event-loop turn as the script call it confirms, so both leave in one write and run in that order.
   */
  wait(replicas: number, timeoutMs: number): Promise<number>;
  /** DEL of one key; resolves to the number deleted. */
  del(key: string): Promise<number>;
  /**
   * A connection of its own, made from the user's client, subscribed to `channel`. `ready` settles once the
   * subscription is confirmed; `close()` ends that connection (and is safe before `ready` settles).
   */
  subscribe(channel: string, onMessage: (message: string) => void): { ready: Promise<void>; close(): void };
  /**
   * Another connection of its own, made from the user's client (same server, options and failover handling), for
   * the store's background work: re-sent writes and their WAITs, which would otherwise block the user's connection.
   * `ready` resolves once it is connected (it may never settle); `close()` ends it, whatever its state.
   */
  sideConnection(): { connection: RedisConnection; ready: Promise<void>; close(): void };
  /**
   * The sockets the store may cork to send one event-loop turn's commands in one write per connection: the client's
   * one, every node's of a Cluster, or none (not connected, or the client batches by itself).
   */
  corkableSockets(): readonly Socket[];
}
