/**
 * @services redis
 */
import { RedisStore } from '@oncely/redis';
import { modelSuite, redisModelStore } from '@oncely/testing';
import Redis from 'ioredis';
import { koaModelApp } from './model-app';

// Random sequences against Koa on a RedisStore, under a key prefix of this run's own.
modelSuite('@oncely/koa', koaModelApp, [
  redisModelStore(
    () => new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 }),
    (client, prefix) => new RedisStore({ client, prefix }),
  ),
]);
