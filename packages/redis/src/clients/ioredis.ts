import type { Socket } from 'node:net';
import type { RedisConnection, ScriptArgument } from './types';

/** The part of an ioredis `Redis` or `Cluster` (5 or 6) the store uses. */
interface IoredisLike {
  duplicate(): IoredisLike;
  on(event: string, listener: (...args: never[]) => void): unknown;
  once(event: string, listener: (...args: never[]) => void): unknown;
  subscribe(channel: string): Promise<unknown>;
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

export function ioredisConnection(client: object): RedisConnection {
  const redis = client as IoredisLike;
  return {
    library: 'ioredis',
    evalsha: (sha, key, args) => redis.evalshaBuffer(sha, 1, key, ...args),
    eval: (lua, key, args) => redis.evalBuffer(lua, 1, key, ...args),
    reserve: (key, value, pxMs) => redis.setBuffer(key, value, 'PX', pxMs, 'NX', 'GET'),
    cluster: typeof redis.nodes === 'function',
    wait: (replicas, timeoutMs) => redis.wait(replicas, timeoutMs),
    del: (key) => redis.del(key),
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
      return { ready, close: () => subscriber.disconnect() };
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
