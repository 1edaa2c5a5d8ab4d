// oncely's stores, built the way their READMEs say, for the servers and the store micro-benchmarks.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { type Duration, type IdempotencyStore, MemoryStore } from '@oncely/core';
import { MySQLStore, withQueryTimeout } from '@oncely/mysql';
import { PostgresStore } from '@oncely/postgres';
import { RedisStore } from '@oncely/redis';
import Redis from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { createClient } from 'redis';
import type { Services, StoreName } from './config';

export interface OpenStore {
  store: IdempotencyStore;
  close(): Promise<void>;
  /**
   * Calls `onCall` on every query (PostgreSQL: a wrapped pool.query) or command (DynamoDB: a wrapped
   * client.send) from now on: round trips, counted. Absent for the stores counted otherwise (Redis: MONITOR).
   */
  countCalls?: (onCall: () => void) => void;
}

export async function openStore(name: StoreName, services: Services): Promise<OpenStore> {
  switch (name) {
    case 'memory': {
      const store = new MemoryStore();
      return { store, close: () => store.close() };
    }
    case 'redis': {
      // ioredis' defaults, as the README's example (auto-pipelining off: docs/stores/redis.md says why);
      // ONCELY_BENCH_REDIS_PIPELINING=1 measures it on.
      const client = new Redis(services.redisUrl, {
        enableAutoPipelining: process.env.ONCELY_BENCH_REDIS_PIPELINING === '1',
      });
      // ONCELY_BENCH_REDIS_COALESCE=0 measures RedisStore with coalesceWrites off.
      const store = new RedisStore({
        client,
        prefix: services.redisPrefix,
        coalesceWrites: process.env.ONCELY_BENCH_REDIS_COALESCE !== '0',
        waitForReplicas: replication(services),
      });
      return {
        store,
        close: async () => {
          await store.close();
          await client.quit();
        },
      };
    }
    case 'redis-node': {
      // node-redis's defaults, as docs/stores/redis.md's example; it writes one turn's commands together itself.
      const client = createClient({ url: services.redisUrl });
      await client.connect();
      const store = new RedisStore({
        client,
        prefix: services.redisPrefix,
        waitForReplicas: replication(services),
      });
      return {
        store,
        close: async () => {
          await store.close();
          client.destroy();
        },
      };
    }
    case 'postgres': {
      // The pg default pool size (10): what `new pg.Pool()` gives a user.
      const pool = new pg.Pool({ connectionString: services.pgUrl });
      const store = new PostgresStore({ pool, schema: services.pgSchema });
      const countCalls = (onCall: () => void) => {
        const query = pool.query.bind(pool);
        pool.query = ((...args: Parameters<typeof query>) => {
          onCall();
          return query(...args);
        }) as typeof pool.query;
      };
      return { store, countCalls, close: () => pool.end() };
    }
    case 'mysql':
      return openMysql(services);
    case 'dynamodb':
      return openDynamo(services);
  }
}

/**
 * As docs/stores/mysql.md's example: a pool of 10 with a connect timeout, wrapped in withQueryTimeout. Statements
 * are counted where the store sends them, on the wrapped pool (execute and query).
 */
async function openMysql(services: Services): Promise<OpenStore> {
  const raw = mysql.createPool({
    uri: services.mysqlUrl,
    connectionLimit: 10,
    connectTimeout: 2_000,
    enableKeepAlive: true,
  });
  const timed = withQueryTimeout(raw, 5_000);
  let onCall: (() => void) | undefined;
  const pool = new Proxy(timed, {
    get(target, property) {
      const value: unknown = Reflect.get(target, property);
      if ((property !== 'execute' && property !== 'query') || typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        onCall?.();
        return (value as (...a: unknown[]) => unknown)(...args);
      };
    },
  });
  const store = new MySQLStore({ pool, table: services.mysqlTable });
  return {
    store,
    countCalls: (callback) => {
      onCall = callback;
    },
    close: () => raw.end(),
  };
}

/** ONCELY_BENCH_REDIS_REPLICA=1 (the runner sets `redisReplicas`): every write confirmed on the replica. */
function replication(services: Services): { replicas: number; timeout: Duration } | undefined {
  return services.redisReplicas === undefined
    ? undefined
    : { replicas: services.redisReplicas, timeout: '1s' };
}

/**
 * @oncely/dynamodb is loaded from its built dist by path (it is not a dependency of this package, so that the
 * benchmarks work with or without it) with the AWS SDK it depends on; the table is created by the runner.
 */
async function openDynamo(services: Services): Promise<OpenStore> {
  const dynamo = services.dynamo;
  if (dynamo === undefined) throw new Error('DynamoDB is not available in this run');
  const { DynamoDBStore } = (await import(pathToFileURL(dynamo.modulePath).href)) as {
    DynamoDBStore: new (options: Record<string, unknown>) => IdempotencyStore;
  };
  const sdk = createRequire(dynamo.sdkPath)('@aws-sdk/client-dynamodb') as {
    DynamoDBClient: new (config: object) => { destroy(): void; send(...args: unknown[]): unknown };
  };
  const client = new sdk.DynamoDBClient({
    endpoint: dynamo.endpoint,
    region: 'us-east-1',
    credentials: { accessKeyId: 'bench', secretAccessKey: 'bench' },
  });
  const store = new DynamoDBStore({ client, tableName: dynamo.table, prefix: services.redisPrefix });
  const countCalls = (onCall: () => void) => {
    const send = client.send.bind(client);
    client.send = (...args: unknown[]) => {
      onCall();
      return send(...args);
    };
  };
  return {
    store,
    countCalls,
    close: async () => {
      await store.close?.();
      client.destroy();
    },
  };
}
