/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { RedisStore } from '@oncely/redis';
import { httpBehaviourSuite, onStore } from '@oncely/testing';
import Redis from 'ioredis';
import { honoHarness } from './harness';

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-hono:${randomUUID()}:`;
const client = new Redis(url, { maxRetriesPerRequest: 1 });
const store = new RedisStore({ client, prefix });

afterAll(async () => {
  await store.close();
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  await client.quit();
});

httpBehaviourSuite(onStore(honoHarness('@oncely/hono'), 'RedisStore', () => store));
