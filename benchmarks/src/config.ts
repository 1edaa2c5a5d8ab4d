// What the runner tells a server or store-benchmark child (as JSON in the BENCH_CONFIG environment variable).

export type Framework = 'express' | 'fastify' | 'hono' | 'koa' | 'nest';
/** oncely's stores; 'none' is the bare framework. */
/** 'redis' is RedisStore through ioredis, 'redis-node' through node-redis (the `redis` package). */
export type StoreName = 'memory' | 'redis' | 'redis-node' | 'postgres' | 'mysql' | 'dynamodb';

export type ServerKind =
  /**
   * Express, Fastify, Hono (on @hono/node-server), Koa (with @koa/bodyparser) or NestJS 11 (on
   * @nestjs/platform-express) with no idempotency middleware; oncely through its adapter for each.
   */
  | { impl: 'bare'; framework: Framework }
  | {
      impl: 'oncely';
      framework: Framework;
      store: StoreName;
      /** With @oncely/opentelemetry: metrics on, recorded by the SDK with a no-op exporter (Fastify only). */
      otel?: boolean;
    }
  /** The floor on Redis (src/floor.ts), by hand in the route, on Express or Fastify. */
  | { impl: 'floor'; framework: 'express' | 'fastify'; store: 'redis' }
  /** express-idempotency on Express 5, with its default in-memory adapter or express-idempotency-redis-adapter. */
  | { impl: 'express-idempotency'; store: 'memory' | 'redis' }
  /** The same NestJS 11 app with @node-idempotency/nestjs. */
  | { impl: 'nest'; store: 'memory' | 'redis' };

export interface Services {
  /** Redis URL for the stores that need it. */
  redisUrl: string;
  /**
   * Replicas RedisStore confirms each reservation and completion on (`waitForReplicas`, timeout 1 s): set by
   * ONCELY_BENCH_REDIS_REPLICA=1, which points `redisUrl` at a private primary with one replica.
   */
  redisReplicas?: number | undefined;
  /** Prefix of every oncely Redis key in this run (peers cannot be given one: their keys carry the run id). */
  redisPrefix: string;
  /** PostgreSQL connection string and the schema of this run (migrated by the runner). */
  pgUrl: string;
  pgSchema: string;
  /** MySQL or MariaDB URL, and the records table of this run (migrated by the runner). */
  mysqlUrl: string;
  mysqlTable: string;
  /** DynamoDB (dynalite) endpoint and table of this run, when @oncely/dynamodb is present. */
  dynamo?: { endpoint: string; table: string; modulePath: string; sdkPath: string } | undefined;
}

export interface ServerConfig {
  kind: ServerKind;
  services: Services;
}

export function readConfig<T>(): T {
  const raw = process.env.BENCH_CONFIG;
  if (raw === undefined)
    throw new Error('BENCH_CONFIG is not set: this script is started by benchmarks/run.ts');
  return JSON.parse(raw) as T;
}
