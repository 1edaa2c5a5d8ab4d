/**
 * @services redis-server
 */
import { type PrivateRedisCluster, startRedisCluster, storeContractSuite } from '@oncely/testing';
import { Cluster } from 'ioredis';
import { Cluster as Cluster6 } from 'ioredis-6';
import { RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { stepCases } from './steps-cases';

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
    // Three round trips after a write with this ttl must still see it: over a cluster's redirects on a loaded
    // machine, 150 ms (the default) is too short.
    shortMs: 300,
  });
}

// Recorded steps live in the record's own key, so a record with steps is as single-slot as any other.
describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))(
  'recorded steps on a 3-master Redis Cluster through %s',
  (name, kind) => {
    let connected: ConnectedClient;
    let store: RedisStore;
    beforeAll(async () => {
      connected = await kind.cluster(cluster.nodes);
      store = new RedisStore({ client: connected.client, prefix: `cluster-steps:${name}:` });
    });
    afterAll(async () => {
      await store.close();
      await connected.close();
    });
    stepCases(() => store);
  },
);

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

test("a hash tag in a client's key does not pick the slot: one client's records still spread over the masters", async () => {
  const client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
  try {
    const prefix = `tagged-${Math.random().toString(36).slice(2)}:`;
    const store = new RedisStore({ client, prefix });
    const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
    // Scoped and unscoped keys, each with a `{...}` that Redis Cluster would hash alone.
    const keys = Array.from({ length: 60 }, (_, i) => (i % 2 === 0 ? `{one}k${i}` : `user-1 {one}k${i}`));
    for (const key of keys) expect((await store.acquire(key, lock)).status).toBe('acquired');
    const perMaster = await Promise.all(client.nodes('master').map((node) => node.keys(`${prefix}*`)));
    expect(perMaster).toHaveLength(3);
    for (const held of perMaster) expect(held.length).toBeGreaterThan(0);
    // Each is still one record: its owner completes it and a retry replays it.
    const done = await store.acquire('{one}done', lock);
    if (done.status !== 'acquired') throw new Error('expected a new key');
    const response = { status: 201, headers: {}, body: Buffer.from('ok') };
    expect(await store.complete('{one}done', done.token, response, 60_000)).toBe(true);
    const replay = await store.acquire('{one}done', lock);
    expect(replay.status === 'completed' && Buffer.from(replay.response.body).toString()).toBe('ok');
  } finally {
    await client.quit();
  }
});

describe.each([
  ['ioredis 5', Cluster],
  ['ioredis 6', Cluster6],
] as const)('coalesceWrites on a Cluster through %s', (_name, ClusterClass) => {
  /** Socket writes (system calls) to all nodes for 30 acquires issued in one event-loop turn, over all 3 masters. */
  async function writesFor(coalesceWrites: boolean): Promise<{ writes: number; nodesWritten: number }> {
    const client = new ClusterClass(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
    const prefix = `coalesce-${coalesceWrites}-${Math.random().toString(36).slice(2)}:`;
    const store = new RedisStore({ client, prefix, coalesceWrites });
    const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
    try {
      // Connect every node and load the script on each (NOSCRIPT retries would add writes).
      for (let i = 0; i < 30; i++) await store.acquire(`warm-${i}`, lock);
      type Writable = { _write: (...a: unknown[]) => void; _writev?: (...a: unknown[]) => void };
      let writes = 0;
      const written = new Set<unknown>();
      for (const node of client.nodes('all')) {
        const socket = (node as unknown as { stream: Writable }).stream;
        for (const method of ['_write', '_writev'] as const) {
          const original = socket[method]?.bind(socket);
          if (original === undefined) continue;
          socket[method] = (...a: unknown[]) => {
            writes++;
            written.add(socket);
            original(...a);
          };
        }
      }
      const results = await Promise.all(Array.from({ length: 30 }, (_, i) => store.acquire(`k-${i}`, lock)));
      expect(results.every((r) => r.status === 'acquired')).toBe(true);
      return { writes, nodesWritten: written.size };
    } finally {
      await store.close();
      await client.quit();
    }
  }

  test("one turn's commands leave in one write per node", async () => {
    expect(await writesFor(true)).toEqual({ writes: 3, nodesWritten: 3 });
  });

  test('coalesceWrites: false writes each command on its own', async () => {
    expect(await writesFor(false)).toEqual({ writes: 30, nodesWritten: 3 });
  });
});

describe.each([
  ['ioredis 5', Cluster],
  ['ioredis 6', Cluster6],
] as const)('enableAutoPipelining on a Cluster through %s', (_name, ClusterClass) => {
  test('is refused at construction, with the fix named, unless scripts are left out of it', async () => {
    const client = new ClusterClass(cluster.nodes, { enableAutoPipelining: true, lazyConnect: true });
    expect(() => new RedisStore({ client })).toThrow(/enableAutoPipelining.*autoPipeliningIgnoredCommands/);
    const onlyOne = new ClusterClass(cluster.nodes, {
      enableAutoPipelining: true,
      autoPipeliningIgnoredCommands: ['evalsha'],
      lazyConnect: true,
    });
    expect(() => new RedisStore({ client: onlyOne })).toThrow(/autoPipeliningIgnoredCommands/);
    client.disconnect();
    onlyOne.disconnect();
  });

  test("with EVALSHA and EVAL left out of auto-pipelining, one turn's calls over every slot all work", async () => {
    const client = new ClusterClass(cluster.nodes, {
      enableAutoPipelining: true,
      autoPipeliningIgnoredCommands: ['evalsha', 'eval'],
      redisOptions: { maxRetriesPerRequest: 1 },
    });
    const prefix = `autopipeline-${Math.random().toString(36).slice(2)}:`;
    const store = new RedisStore({ client, prefix });
    const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
    try {
      const acquired = await Promise.all(Array.from({ length: 60 }, (_, i) => store.acquire(`k-${i}`, lock)));
      expect(acquired.map((r) => r.status)).toEqual(Array(60).fill('acquired'));
      const response = { status: 201, headers: {}, body: new Uint8Array([1, 2, 3]) };
      const completed = await Promise.all(
        acquired.map((r, i) =>
          r.status === 'acquired' ? store.complete(`k-${i}`, r.token, response, 60_000) : false,
        ),
      );
      expect(completed).toEqual(Array(60).fill(true));
      const replays = await Promise.all(Array.from({ length: 60 }, (_, i) => store.acquire(`k-${i}`, lock)));
      expect(replays.map((r) => r.status)).toEqual(Array(60).fill('completed'));
      // Del through auto-pipelining (keyed by its first argument, the key) works as it is.
      const counts = await Promise.all(client.nodes('master').map((node) => node.keys(`${prefix}*`)));
      expect(counts.filter((keys) => keys.length > 0)).toHaveLength(3);
    } finally {
      await store.close();
      await client.quit();
    }
  });
});
