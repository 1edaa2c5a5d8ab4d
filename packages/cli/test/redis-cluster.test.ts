/**
 * @services redis-server
 */
import { randomBytes } from 'node:crypto';
import { RedisStore } from '@oncely/redis';
import { type PrivateRedisCluster, startRedisCluster } from '@oncely/testing';
import { Cluster } from 'ioredis';
import type { ListPage, RecordView } from '../src';
import { oncely } from './fixture';
import { cliSuite } from './suite';

// A 3-master Cluster of the test's own: a list must SCAN every master, and a key holding a brace lives under the
// store's digest tag, which the command must compute as the store does.
let cluster: PrivateRedisCluster;
let client: Cluster;
const prefix = `oncely-cli-${randomBytes(4).toString('hex')}:`;
const nodes = () => cluster.nodes.flatMap((node) => ['--node', `${node.host}:${node.port}`]);

jest.setTimeout(60_000);

beforeAll(async () => {
  cluster = await startRedisCluster(3);
  client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
});
afterAll(async () => {
  client?.disconnect();
  await cluster?.stop();
});

cliSuite('oncely on a Redis Cluster', {
  store: () => new RedisStore({ client, prefix }),
  connection: () => [...nodes(), '--prefix', prefix],
  writeForeign: async (storeKey) => {
    await client.set(prefix + storeKey, 'not a record');
  },
});

test('keys on every master, and a key with braces under its digest tag, are all found', async () => {
  const store = new RedisStore({ client, prefix: `spread-${prefix}` });
  const keys = Array.from({ length: 30 }, (_, i) => `k${i}`).concat(['{tagged}key']);
  for (const key of keys) await store.acquire(key, { fingerprint: 'f', lockTimeoutMs: 60_000 });
  const args = [...nodes(), '--prefix', `spread-${prefix}`];
  const seen: string[] = [];
  let cursor: string | undefined;
  do {
    const result = await oncely([
      'list',
      '--limit',
      '7',
      '--json',
      ...args,
      ...(cursor ? ['--cursor', cursor] : []),
    ]);
    expect(result.code).toBe(0);
    const page = result.json<ListPage>();
    seen.push(...page.records.map((r) => r.key));
    cursor = page.cursor;
  } while (cursor !== undefined);
  expect(seen.sort()).toEqual([...keys].sort());

  const tagged = await oncely(['inspect', '{tagged}key', '--json', ...args]);
  expect(tagged.code).toBe(0);
  const record = tagged.json<RecordView>();
  expect(record.location).toMatch(/^spread-oncely-cli-[0-9a-f]+:\{[A-Za-z0-9_-]{12}\}\{tagged\}key$/);
  expect(record.bytes).toBeGreaterThan(0);
  expect((await oncely(['delete', '{tagged}key', '--yes', ...args])).code).toBe(0);
  expect(await store.get('{tagged}key')).toBeUndefined();
});
