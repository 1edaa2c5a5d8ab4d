/**
 * @services redis
 */
import { modelSuite, redisModelStore } from '@oncely/testing';
import Redis from 'ioredis';
import { express4ModelApp, express5ModelApp } from '../../express/test/model-app';
import { fastifyModelApp } from '../../fastify/test/model-app';
import { RedisStore } from '../src';

// The model test (random sequences, checked invariants: @oncely/testing's model.ts) of Express and Fastify on a
// RedisStore, here where ioredis is; each on MemoryStore in its own package. Keys live under a prefix of this run's
// own, deleted after all.
const onRedis = () =>
  redisModelStore(
    () => new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 }),
    (client, prefix) => new RedisStore({ client, prefix }),
  );

modelSuite('Express 5', express5ModelApp, [onRedis()]);
modelSuite('Express 4', express4ModelApp, [onRedis()]);
modelSuite('Fastify 5', fastifyModelApp, [onRedis()]);
