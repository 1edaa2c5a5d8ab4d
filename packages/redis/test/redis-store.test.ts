import { randomUUID } from 'node:crypto';
import { storeContractSuite } from '@oncely/testing';
import Redis from 'ioredis';
import { RedisStore } from '../src';

// The machine's shared Redis: every test file uses its own random prefix and never flushes.
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:${randomUUID()}:`;
let client: Redis;

storeContractSuite('RedisStore', {
  create: () => {
    client = new Redis(url, { lazyConnect: false, maxRetriesPerRequest: 1 });
    return new RedisStore({ client, prefix });
  },
  destroy: async (store) => {
    await store.close?.();
    const keys = await client.keys(`${prefix}*`);
    if (keys.length > 0) await client.del(...keys);
    await client.quit();
  },
});
