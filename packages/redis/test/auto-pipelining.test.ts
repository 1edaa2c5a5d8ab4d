/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { storeContractSuite } from '@oncely/testing';
import Redis from 'ioredis';
import Redis6 from 'ioredis-6';
import { RedisStore } from '../src';

// ioredis' enableAutoPipelining batches commands of one tick into one write: a common production setting that
// once made every script call fail (the SHA went out as the command name).
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:${randomUUID()}:`;
const options = { enableAutoPipelining: true, maxRetriesPerRequest: 1 };
for (const [name, create] of [
  ['ioredis 5', () => new Redis(url, options)],
  ['ioredis 6', () => new Redis6(url, options)],
] as const) {
  let client: Redis | Redis6;
  storeContractSuite(`RedisStore with enableAutoPipelining on ${name}`, {
    create: () => {
      client = create();
      return new RedisStore({ client, prefix });
    },
    destroy: async (store) => {
      await store.close?.();
      const keys = await client.keys(`${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
      await client.quit();
    },
  });
}
