import type { Socket } from 'node:net';
import { untilFirstConnection } from './first-connection';
import type { RedisConnection, ScriptArgument } from './types';

/** The part of an ioredis `Redis` or `Cluster` (5 or 6) the store uses. */
interface IoredisLike {
  duplicate(): IoredisLike;
  on(event: string, listener: (...args: never[]) => void): unknown;
  once(event: string, listener: (...args: never[]) => void): unknown;
  removeListener(event: string, listener: (...args: never[]) => void): unknown;
  subscribe(channel: string): Promise<unknown>;
  connect(): Promise<unknown>;
  disconnect(): void;
  del(key: string): Promise<number>;
  wait(replicas: number, timeoutMs: number): Promise<number>;
  /** A Cluster's: one client per node. */
  nodes?: (role: 'all') => { stream?: Socket; status?: string }[];
  status?: string;
  stream?: Socket;
  // At runtime, not in ioredis 5's types. callBuffer('evalsha', ...) would be typed, but with `enableAutoPipelining`
  // ioredis then sends the SHA as the command name (every call fails).
  evalshaBuffer(sha: string, keys: number, ...args: ScriptArgument[]): Promise<unknown>;
  evalBuffer(lua: string, keys: number, ...args: ScriptArgument[]): Promise<unknown>;
  setBuffer(key: string, value: string, px: 'PX', pxMs: number, nx: 'NX', get: 'GET'): Promise<unknown>;
}

const NONE: readonly Socket[] = [];

function corkable(stream: Socket | undefined): stream is Socket {
  return stream !== undefined && typeof stream.cork === 'function' && !stream.destroyed;
}

/** True for an ioredis client: the library's Buffer-reply commands are there. */
export function isIoredis(client: object): boolean {
  const c = client as Partial<Record<string, unknown>>;
  return typeof c.callBuffer === 'function' && typeof c.duplicate === 'function';
}

/**
 * An ioredis Cluster with `enableAutoPipelining` groups each command into a pipeline by the slot of its first
 * argument, which for EVALSHA and EVAL is the script, not the key: the store's calls for keys of different slots
 * meet in one pipeline, and every one fails ("All keys in the pipeline should belong to the same slots allocation
 * group"; ioredis 5.9 and 6.0). Those two commands left out of auto-pipelining go by their key, and work.
 */
export function autoPipelinesScriptsOnCluster(client: object): boolean {
  const redis = client as IoredisLike & {
    options?: { enableAutoPipelining?: unknown; autoPipeliningIgnoredCommands?: unknown };
  };
  if (typeof redis.nodes !== 'function' || redis.options?.enableAutoPipelining !== true) return false;
  const ignored = redis.options.autoPipeliningIgnoredCommands;
  // Compared as ioredis compares them: lower-case command names.
  return !(Array.isArray(ignored) && ignored.includes('evalsha') && ignored.includes('eval'));
}

interface IoredisOptions {
  enableOfflineQueue?: unknown;
  commandTimeout?: unknown;
  connectTimeout?: unknown;
  /** A Cluster's options for its node connections. */
  redisOptions?: { commandTimeout?: unknown };
}

const CONNECTING = new Set(['wait', 'connecting', 'connect', 'reconnecting']);

/** ioredis's own connect timeout when none is set: the bound of the first connection's wait without a command timeout. */
const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

const positive = (value: unknown): number | undefined =>
  typeof value === 'number' && Number.isFinite(value) && value > 0 ? value : undefined;

/** Runs commands once the client has first connected, when its offline queue is off (it queues them itself otherwise). */
function firstConnectionGate(redis: IoredisLike): <T>(send: () => Promise<T>) => Promise<T> {
  const options = (redis as { options?: IoredisOptions }).options;
  if (options?.enableOfflineQueue !== false) return (send) => send();
  const boundMs =
    positive(options.commandTimeout) ??
    positive(options.redisOptions?.commandTimeout) ??
    positive(options.connectTimeout) ??
    DEFAULT_CONNECT_TIMEOUT_MS;
  return untilFirstConnection(
    {
      isReady: () => redis.status === 'ready',
      isConnecting: () => redis.status !== undefined && CONNECTING.has(redis.status),
      // As ioredis does itself for a command sent to a `lazyConnect` client.
      start: () => {
        if (redis.status === 'wait') redis.connect().catch(() => {});
      },
      onceReady(listener) {
        redis.once('ready', listener);
        return () => redis.removeListener('ready', listener);
      },
    },
    boundMs,
  );
}

export function ioredisConnection(client: object): RedisConnection {
  const redis = client as IoredisLike;
  const connected = firstConnectionGate(redis);
  return {
    library: 'ioredis',
    evalsha: (sha, key, args) => connected(() => redis.evalshaBuffer(sha, 1, key, ...args)),
    eval: (lua, key, args) => connected(() => redis.evalBuffer(lua, 1, key, ...args)),
    reserve: (key, value, pxMs) => connected(() => redis.setBuffer(key, value, 'PX', pxMs, 'NX', 'GET')),
    cluster: typeof redis.nodes === 'function',
    wait: (replicas, timeoutMs) => connected(() => redis.wait(replicas, timeoutMs)),
    del: (key) => connected(() => redis.del(key)),
    subscribe(channel, onMessage) {
      const subscriber = redis.duplicate();
      // Without a listener ioredis would print every reconnection error; waiters already degrade to polling.
      subscriber.on('error', () => {});
      // The message is the script's KEYS[1], which ioredis prefixed with the client's `keyPrefix` (channels it
      // leaves alone): the store knows its keys without it.
      const keyPrefix = (redis as { options?: { keyPrefix?: unknown } }).options?.keyPrefix;
      const strip = typeof keyPrefix === 'string' && keyPrefix !== '' ? keyPrefix.length : 0;
      subscriber.on('message', (_channel: never, message: never) =>
        onMessage(strip === 0 ? String(message) : String(message).slice(strip)),
      );
      // Subscribed once connected: the duplicate inherits the client's options, and with the recommended
      // `enableOfflineQueue: false` a SUBSCRIBE sent while it connects would fail.
      const ready = new Promise<void>((resolve) => subscriber.once('ready', () => resolve())).then(() =>
        subscriber.subscribe(channel).then(() => undefined),
      );
      // A client made with `lazyConnect: true` passes it on: nothing would ever connect the duplicate. A failed
      // attempt is retried by ioredis itself, and the waiter's timeout bounds the wait meanwhile.
      if (subscriber.status === 'wait') subscriber.connect().catch(() => {});
      return { ready, close: () => subscriber.disconnect() };
    },
    sideConnection() {
      const side = redis.duplicate();
      side.on('error', () => {}); // reconnection noise: the store retries what fails
      const ready = new Promise<void>((resolve) => side.once('ready', () => resolve()));
      if (side.status === 'wait') side.connect().catch(() => {});
      return { connection: ioredisConnection(side), ready, close: () => side.disconnect() };
    },
    corkableSockets() {
      // While connecting, ioredis queues commands itself: nothing to cork.
      if (redis.status !== 'ready') return NONE;
      if (typeof redis.nodes !== 'function') return corkable(redis.stream) ? [redis.stream] : NONE;
      // A Cluster: a connection per node, and a turn's commands go to several. Corking every connected node's
      // (a no-op on those the turn does not write to) gives each node one write per turn, as a single node gets.
      const streams: Socket[] = [];
      for (const node of redis.nodes('all')) if (corkable(node.stream)) streams.push(node.stream);
      return streams;
    },
  };
}
