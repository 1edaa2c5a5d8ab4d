import Redis5, { Cluster as Cluster5 } from 'ioredis';
import Redis6, { Cluster as Cluster6 } from 'ioredis-6';
import { createClient as createClient6, createCluster as createCluster6 } from 'redis';
import { createClient as createClient5, createCluster as createCluster5 } from 'redis-5';
import type { IoredisClient, NodeRedisClient } from '../src';

// Every Redis client RedisStore supports, each configured as docs/stores/redis.md recommends: a command timeout,
// no offline queue (a down server fails at once), a fixed reconnect delay. Tests run their cases once per client.

export interface ConnectedClient {
  client: IoredisClient | NodeRedisClient;
  /** Ends the connection whatever its state. */
  close(): Promise<void>;
}

export interface ClientKind {
  /** 'ioredis 5', 'node-redis 6'... */
  name: string;
  library: 'ioredis' | 'node-redis';
  /** A connected standalone client; `commandTimeoutMs` bounds each command (default 2000). */
  standalone(url: string, commandTimeoutMs?: number): Promise<ConnectedClient>;
  /** A connected cluster client. */
  cluster(nodes: { host: string; port: number }[]): Promise<ConnectedClient>;
}

/** What the tests need of an ioredis Redis or Cluster, whichever the version. */
type IoredisTestClient = IoredisClient & {
  on(event: 'error', listener: (error: unknown) => void): unknown;
  once(event: 'ready', listener: () => void): unknown;
  disconnect(): void;
};

const ioredisOptions = (commandTimeoutMs: number) => ({
  commandTimeout: commandTimeoutMs,
  maxRetriesPerRequest: 1,
  enableOfflineQueue: false,
  retryStrategy: () => 100,
});

function ioredisKind(
  name: string,
  createRedis: (url: string, options: ReturnType<typeof ioredisOptions>) => IoredisTestClient,
  createCluster: (nodes: { host: string; port: number }[]) => IoredisTestClient,
): ClientKind {
  const connect = async (client: IoredisTestClient): Promise<ConnectedClient> => {
    client.on('error', () => {}); // reconnection noise: the requests carry the errors
    await new Promise<void>((resolve) => client.once('ready', resolve)); // no offline queue: be connected first
    return { client, close: async () => client.disconnect() };
  };
  return {
    name,
    library: 'ioredis',
    standalone: (url, commandTimeoutMs = 2000) => connect(createRedis(url, ioredisOptions(commandTimeoutMs))),
    cluster: (nodes) => connect(createCluster(nodes)),
  };
}

/** What the tests need of a node-redis client or cluster, whichever the version. */
type NodeRedisTestClient = NodeRedisClient & {
  on(event: 'error', listener: (error: unknown) => void): unknown;
  connect(): Promise<unknown>;
  destroy(): void;
};

// node-redis's command timeout ends when the command is written: a server that hangs after that is caught by the
// socket timeout (no data for that long closes the connection and fails what is in flight), and the ping keeps an
// idle connection from hitting it.
const clientOptions = (url: string, commandTimeoutMs: number) => ({
  url,
  disableOfflineQueue: true,
  pingInterval: Math.floor(commandTimeoutMs / 2),
  commandOptions: { timeout: commandTimeoutMs },
  socket: {
    socketTimeout: commandTimeoutMs,
    connectTimeout: commandTimeoutMs,
    reconnectStrategy: () => 100,
  },
});

const clusterOptions = (nodes: { host: string; port: number }[]) => ({
  rootNodes: nodes.map(({ host, port }) => ({ url: `redis://${host}:${port}` })),
});

function nodeRedisKind(
  name: string,
  createClient: (options: ReturnType<typeof clientOptions>) => NodeRedisTestClient,
  createCluster: (options: ReturnType<typeof clusterOptions>) => NodeRedisTestClient,
): ClientKind {
  const connect = async (client: NodeRedisTestClient): Promise<ConnectedClient> => {
    client.on('error', () => {}); // without a listener node-redis throws connection errors
    await client.connect();
    return { client, close: async () => client.destroy() };
  };
  return {
    name,
    library: 'node-redis',
    standalone: (url, commandTimeoutMs = 2000) => connect(createClient(clientOptions(url, commandTimeoutMs))),
    cluster: (nodes) => connect(createCluster(clusterOptions(nodes))),
  };
}

export const CLIENT_KINDS: readonly ClientKind[] = [
  ioredisKind(
    'ioredis 5',
    (url, options) => new Redis5(url, options),
    (nodes) => new Cluster5(nodes, { redisOptions: { maxRetriesPerRequest: 1 } }),
  ),
  ioredisKind(
    'ioredis 6',
    (url, options) => new Redis6(url, options),
    (nodes) => new Cluster6(nodes, { redisOptions: { maxRetriesPerRequest: 1 } }),
  ),
  nodeRedisKind(
    'node-redis 5',
    (options) => createClient5(options),
    (options) => createCluster5(options),
  ),
  nodeRedisKind(
    'node-redis 6',
    (options) => createClient6(options),
    (options) => createCluster6(options),
  ),
];
