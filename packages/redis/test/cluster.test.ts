/**
 * @services redis-server
 */
import { type PrivateRedisCluster, startRedisCluster, storeContractSuite } from '@oncely/testing';
import { Cluster } from 'ioredis';
import { RedisStore } from '../src';

// A 3-master Redis Cluster of the test's own, from the system redis-server binary.
let cluster: PrivateRedisCluster;
let client: Cluster;

jest.setTimeout(60_000);

beforeAll(async () => {
  cluster = await startRedisCluster(3);
  client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
});
afterAll(async () => {
  await client.quit();
  await cluster.stop();
});

storeContractSuite('RedisStore on a 3-master Redis Cluster', {
  create: () => new RedisStore({ client, prefix: 'cluster-test:' }),
});

test('records spread over all three masters (so the suite above really crossed slots)', async () => {
  const store = new RedisStore({ client, prefix: 'spread:' });
  for (let i = 0; i < 60; i++) await store.acquire(`k${i}`, { fingerprint: 'f', lockTimeoutMs: 30_000 });
  const counts = await Promise.all(client.nodes('master').map((node) => node.dbsize()));
  expect(counts).toHaveLength(3);
  for (const n of counts) expect(n).toBeGreaterThan(0);
});
