/**
 * @services redis-server
 */
import { type PrivateRedisCluster, startRedisCluster, storeContractSuite } from '@oncely/testing';
import { Cluster } from 'ioredis';
import { RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';

// A 3-master Redis Cluster of the test's own, from the system redis-server binary; the store contract runs on it
// through each client RedisStore supports.
let cluster: PrivateRedisCluster;

jest.setTimeout(60_000);

beforeAll(async () => {
  cluster = await startRedisCluster(3);
});
afterAll(async () => {
  await cluster.stop();
});

for (const kind of CLIENT_KINDS) {
  let connected: ConnectedClient;
  storeContractSuite(`RedisStore on a 3-master Redis Cluster through ${kind.name}`, {
    create: async () => {
      connected = await kind.cluster(cluster.nodes);
      return new RedisStore({ client: connected.client, prefix: `cluster-test:${kind.name}:` });
    },
    destroy: async (store) => {
      await store.close?.();
      await connected.close();
    },
  });
}

test('records spread over all three masters (so the suites above really crossed slots)', async () => {
  const client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
  try {
    const store = new RedisStore({ client, prefix: 'spread:' });
    for (let i = 0; i < 60; i++) await store.acquire(`k${i}`, { fingerprint: 'f', lockTimeoutMs: 30_000 });
    const counts = await Promise.all(client.nodes('master').map((node) => node.dbsize()));
    expect(counts).toHaveLength(3);
    for (const n of counts) expect(n).toBeGreaterThan(0);
  } finally {
    await client.quit();
  }
});
