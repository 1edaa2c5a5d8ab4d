/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { storeContractSuite } from '@oncely/testing';
import Redis from 'ioredis';
import { RedisStore } from '../src';

// ioredis' enableAutoPipelining batches commands of one tick into one write: a common production setting that
// once made every script call fail (the SHA went out as the command name).
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:${randomUUID()}:`;
let client: Redis;

storeContractSuite('RedisStore with enableAutoPipelining', {
  create: () => {
    client = new Redis(url, { enableAutoPipelining: true, maxRetriesPerRequest: 1 });
    return new RedisStore({ client, prefix });
  },
  destroy: async (store) => {
    await store.close?.();
    const keys = await client.keys(`${prefix}*`);
    if (keys.length > 0) await client.del(...keys);
    await client.quit();
  },
});
