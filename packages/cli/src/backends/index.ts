import type { BackendFactory } from './types';

/**
 * The backends by URL scheme, each loaded only when its URL is given (a dynamic import: its own chunk), so that
 * one store's client library is never needed for another's. A new store adds its schemes here.
 */
export const BACKENDS: Readonly<Record<string, () => Promise<BackendFactory>>> = {
  'redis:': async () => (await import('./redis')).openRedis,
  'rediss:': async () => (await import('./redis')).openRedis,
  'redis-cluster:': async () => (await import('./redis')).openRedis,
  'dynamodb:': async () => (await import('./dynamodb')).openDynamoDB,
  'postgres:': async () => (await import('./postgres')).openPostgres,
  'postgresql:': async () => (await import('./postgres')).openPostgres,
  'mysql:': async () => (await import('./mysql')).openMySQL,
  'mariadb:': async () => (await import('./mysql')).openMySQL,
};

/** The environment variables read when no `--url` is given, in this order. */
export const URL_VARIABLES = ['ONCELY_URL', 'REDIS_URL', 'DATABASE_URL', 'DYNAMODB_URL'] as const;
