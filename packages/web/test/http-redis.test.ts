/**
 * @services redis
 */
import { RedisStore } from '@oncely/redis';
import { httpSuiteOnRedis } from '@oncely/testing';
import Redis from 'ioredis';
import { webHarness } from './harness';

httpSuiteOnRedis(
  [webHarness('@oncely/web')],
  () => new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 }),
  (client, prefix) => new RedisStore({ client, prefix }),
);
