/**
 * @services redis
 */
import { RedisStore } from '@oncely/redis';
import { modelSuite, redisModelStore } from '@oncely/testing';
import Redis from 'ioredis';
import { webModelApp } from './model-app';

// Random sequences against @oncely/web on a RedisStore, under a key prefix of this run's own.
modelSuite('@oncely/web', webModelApp, [
  redisModelStore(
    () => new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 }),
    (client, prefix) => new RedisStore({ client, prefix }),
  ),
]);
