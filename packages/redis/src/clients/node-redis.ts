import type { Socket } from 'node:net';
import { StoreOperationError } from '@oncely/core';
import { untilFirstConnection } from './first-connection';
import type { RedisConnection, ScriptArgument } from './types';

type CommandArguments = (string | Buffer)[];
interface CommandOptions {
  typeMapping: Record<number, unknown>;
}

/** The part of a node-redis client (`createClient()`, redis 5 or 6) the store uses. */
interface NodeRedisClientLike {
  sendCommand(args: CommandArguments, options?: CommandOptions): Promise<unknown>;
  duplicate(): NodeRedisSubscriber;
}

/** What a node-redis client (not a cluster) tells of its connection. */
interface NodeRedisConnectionState {
  readonly isOpen: boolean;
  readonly isReady: boolean;
  readonly options?: {
    disableOfflineQueue?: unknown;
    commandOptions?: { timeout?: unknown };
    socket?: { connectTimeout?: unknown };
  };
  once(event: 'ready', listener: () => void): unknown;
  removeListener(event: 'ready', listener: () => void): unknown;
}

/** node-redis's own connect timeout when none is set. */
const DEFAULT_CONNECT_TIMEOUT_MS = 5000;

const positive = (value: unknown): number | undefined =>
  typeof value === 'number' && Number.isFinite(value) && value > 0 ? value : undefined;

/**
 * With `disableOfflineQueue`, a client whose `connect()` was called but not yet done refuses commands: until it has
 * been ready once, they wait for it. A client never opened is the user's to connect: its commands fail at once.
 */
function firstConnectionGate(client: object, cluster: boolean): <T>(send: () => Promise<T>) => Promise<T> {
  const state = client as NodeRedisConnectionState;
  if (cluster || state.options?.disableOfflineQueue !== true) return (send) => send();
  return untilFirstConnection(
    {
      isReady: () => state.isReady,
      isConnecting: () => state.isOpen && !state.isReady,
      start: () => {},
      onceReady(listener) {
        state.once('ready', listener);
        return () => state.removeListener('ready', listener);
      },
    },
    positive(state.options.commandOptions?.timeout) ??
      positive(state.options.socket?.connectTimeout) ??
      DEFAULT_CONNECT_TIMEOUT_MS,
  );
}

/** The part of a node-redis cluster (`createCluster()`) the store uses. */
interface NodeRedisClusterLike {
  sendCommand(
    firstKey: string,
    isReadonly: boolean,
    args: CommandArguments,
    options?: CommandOptions,
  ): Promise<unknown>;
  duplicate(): NodeRedisSubscriber;
}

interface NodeRedisSubscriber {
  on(event: 'error', listener: (error: unknown) => void): unknown;
  connect(): Promise<unknown>;
  subscribe(channel: string, listener: (message: string) => void): Promise<void>;
  destroy(): void;
}

/**
 * RESP's blob-string type code (`$`, 36; `RESP_TYPES.BLOB_STRING` in redis 5 and 6), mapped to Buffer: bodies are
 * raw bytes. Passed per command, so the client's own command options (its `timeout`) still apply: node-redis
 * merges them.
 */
const BUFFER_REPLIES: CommandOptions = { typeMapping: { 36: Buffer } };

/** True for a node-redis 5+ client or cluster. */
export function isNodeRedis(client: object): boolean {
  const c = client as Partial<Record<string, unknown>>;
  return typeof c.sendCommand === 'function' && typeof c.duplicate === 'function' && 'isOpen' in c;
}

/** node-redis 4 has no per-command type mapping (its Buffer replies work differently), so it is refused. */
export function isNodeRedis5OrLater(client: object): boolean {
  return typeof (client as Partial<Record<string, unknown>>).withTypeMapping === 'function';
}

const text = (value: ScriptArgument): string | Buffer => (typeof value === 'number' ? String(value) : value);

const NONE: readonly Socket[] = [];

export function nodeRedisConnection(client: object): RedisConnection {
  // A cluster routes by key: sendCommand(firstKey, isReadonly, args); a client takes the args alone.
  const cluster = 'masters' in client;
  const connected = firstConnectionGate(client, cluster);
  const send = cluster
    ? (key: string, args: CommandArguments) =>
        (client as unknown as NodeRedisClusterLike).sendCommand(key, false, args, BUFFER_REPLIES)
    : (_key: string, args: CommandArguments) =>
        connected(() => (client as unknown as NodeRedisClientLike).sendCommand(args, BUFFER_REPLIES));
  const script = (
    command: 'EVALSHA' | 'EVAL',
    body: string,
    key: string,
    args: readonly ScriptArgument[],
  ) => {
    const commandArguments: CommandArguments = [command, body, '1', key];
    for (const arg of args) commandArguments.push(text(arg));
    return send(key, commandArguments);
  };
  return {
    library: 'node-redis',
    evalsha: (sha, key, args) => script('EVALSHA', sha, key, args),
    eval: (lua, key, args) => script('EVAL', lua, key, args),
    reserve: (key, value, pxMs) => send(key, ['SET', key, value, 'PX', String(pxMs), 'NX', 'GET']),
    cluster,
    wait: async (replicas, timeoutMs) =>
      Number(
        await connected(() =>
          (client as unknown as NodeRedisClientLike).sendCommand([
            'WAIT',
            String(replicas),
            String(timeoutMs),
          ]),
        ),
      ),
    del: async (key) => Number(await send(key, ['DEL', key])),
    subscribe(channel, onMessage) {
      // A subscribed node-redis connection takes no other commands: a duplicate of the user's client, ours to close.
      const subscriber = (client as unknown as NodeRedisClientLike).duplicate();
      // Without a listener node-redis would throw every connection error as an uncaught 'error' event.
      subscriber.on('error', () => {});
      let closed = false;
      const close = () => {
        if (closed) return;
        closed = true;
        try {
          subscriber.destroy();
        } catch {
          // never connected: nothing to close
        }
      };
      const ready = subscriber.connect().then(() => {
        if (closed) throw new StoreOperationError('oncely/redis: the store was closed while subscribing');
        return subscriber.subscribe(channel, onMessage);
      });
      return { ready, close };
    },
    sideConnection() {
      const side = (client as unknown as NodeRedisClientLike).duplicate();
      side.on('error', () => {}); // connection errors: the store retries what fails
      let closed = false;
      const ready = side.connect().then(() => undefined);
      ready.catch(() => {}); // awaited with a bound by the store; a failed connection is replaced
      const close = () => {
        if (closed) return;
        closed = true;
        try {
          side.destroy();
        } catch {
          // never connected: nothing to close
        }
      };
      return { connection: nodeRedisConnection(side), ready, close };
    },
    // node-redis writes the commands of one event-loop turn together by itself.
    corkableSockets: () => NONE,
  };
}
