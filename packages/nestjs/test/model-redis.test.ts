/**
 * @services redis
 */
import { RedisStore } from '@oncely/redis';
import { modelSuite, redisModelStore } from '@oncely/testing';
import Redis from 'ioredis';
import { nestModelApp } from './model-app';

// Random sequences against NestJS on both platforms on a RedisStore, under a key prefix of this run's own.
const onRedis = () =>
  redisModelStore(
    () => new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 }),
    (client, prefix) => new RedisStore({ client, prefix }),
  );
modelSuite('NestJS on express', nestModelApp('express'), [onRedis()]);
modelSuite('NestJS on fastify', nestModelApp('fastify'), [onRedis()]);
