/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { RedisStore } from '@oncely/redis';
import Redis from 'ioredis';
import { expressServer, fastifyServer } from './servers';
import { clientSuite } from './suite';

// One client and one store per server kind, under a prefix of this file's own: nothing of another run is seen.
const client = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 });
const prefix = `oncely-client-test:${randomUUID()}:`;
const stores = [expressServer, fastifyServer].map(
  (_kind, i) => new RedisStore({ client, prefix: `${prefix}${i}:` }),
);

afterAll(async () => {
  await Promise.all(stores.map((store) => store.close()));
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  await client.quit();
});

[expressServer, fastifyServer].forEach((kind, i) => {
  const store = stores[i] as RedisStore;
  clientSuite(kind, 'RedisStore', () => store);
});
