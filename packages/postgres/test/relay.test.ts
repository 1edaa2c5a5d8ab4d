/**
 * @services postgres redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { RedisStore } from '@oncely/redis';
import { startAppProcess } from '@oncely/testing';
import Redis from 'ioredis';
import { CachedStore, OutboxRelay, PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

jest.setTimeout(60_000);

const db = testSchema();
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-relay:${randomUUID()}:`;
let client: Redis;
let source: PostgresStore;
let cache: RedisStore;

beforeAll(async () => {
  source = new PostgresStore({ pool: db.pool(), schema: db.schema, outbox: true });
  await source.migrate();
  client = new Redis(redisUrl);
  cache = new RedisStore({ client, prefix });
});
afterAll(async () => {
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  await client.quit();
  await db.drop();
});

const outboxSize = async () =>
  Number((await db.pool().query(`SELECT count(*) FROM ${source.tables.outbox}`)).rows[0].count);

async function completeRecords(label: string, n: number): Promise<string[]> {
  const keys = Array.from({ length: n }, (_, i) => `${label}-${i}`);
  for (const key of keys) {
    const acquired = await source.acquire(key, { fingerprint: `fp-${key}`, lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error('expected acquired');
    const body = Buffer.from(JSON.stringify({ key }));
    await source.complete(
      key,
      acquired.token,
      { status: 201, headers: { 'content-type': 'application/json' }, body },
      3_600_000,
    );
  }
  return keys;
}

test('completions are queued in the outbox by the same statement that completes them', async () => {
  const before = await outboxSize();
  await completeRecords('queued', 3);
  expect(await outboxSize()).toBe(before + 3);
  const acquired = await source.acquire('released', { fingerprint: 'f', lockTimeoutMs: 30_000 });
  if (acquired.status === 'acquired') await source.release('released', acquired.token);
  expect(await outboxSize()).toBe(before + 3); // a release queues nothing
  await new OutboxRelay({ store: source, cache, batchSize: 100 }).runOnce();
  expect(await outboxSize()).toBe(0);
});

test('a relay over a store without outbox: true is refused at construction, naming the fix', () => {
  const plain = new PostgresStore({ pool: db.pool(), schema: db.schema });
  expect(() => new OutboxRelay({ store: plain, cache })).toThrow(/outbox: true/);
});

test('two relays share the outbox: each record is copied exactly once, none is missed', async () => {
  const keys = await completeRecords('two', 400);
  const relays = [
    new OutboxRelay({ store: source, cache, batchSize: 25 }),
    new OutboxRelay({ store: source, cache, batchSize: 25 }),
  ];
  const copiedBy: string[][] = [[], []];
  await Promise.all(
    relays.map(async (relay, i) => {
      for (;;) {
        const run = await relay.runOnce();
        copiedBy[i]?.push(...run.copied);
        if (run.claimed === 0) return;
      }
    }),
  );
  const all = [...(copiedBy[0] ?? []), ...(copiedBy[1] ?? [])];
  expect(all).toHaveLength(400);
  expect(new Set(all).size).toBe(400);
  expect((copiedBy[0] ?? []).length).toBeGreaterThan(0);
  expect((copiedBy[1] ?? []).length).toBeGreaterThan(0);
  expect(await outboxSize()).toBe(0);
  for (const key of keys.slice(0, 20)) {
    const copy = await cache.get(key);
    expect(copy?.state).toBe('completed');
    expect(copy?.fingerprint).toBe(`fp-${key}`);
    expect(Buffer.from(copy?.response?.body ?? []).toString()).toBe(JSON.stringify({ key }));
    // The copy expires with the original (TTL from PostgreSQL's clock).
    expect(await client.pttl(prefix + key)).toBeGreaterThan(3_500_000);
  }
});

test('a relay killed mid-batch loses nothing: the next relay copies the rest, and nothing twice', async () => {
  const keys = await completeRecords('killed', 50);
  const doomed = await startAppProcess(join(__dirname, 'fixtures', 'relay.ts'), {
    DATABASE_URL: connectionString,
    SCHEMA: db.schema,
    REDIS_URL: redisUrl,
    PREFIX: prefix,
    BATCH: '50',
    COPY_THEN_HANG: '20',
  });
  await doomed.waitForLine((line) => line === 'copied 20');
  await doomed.kill();
  // Its transaction rolled back: the whole batch is still queued, though 20 copies already reached Redis.
  let queued = await outboxSize();
  for (let i = 0; i < 50 && queued < 50; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    queued = await outboxSize();
  }
  expect(queued).toBe(50);
  let run = await new OutboxRelay({ store: source, cache, batchSize: 100 }).runOnce();
  // The survivor may have had to wait for PostgreSQL to notice the dead session (its rows were locked).
  for (let i = 0; i < 50 && run.claimed === 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    run = await new OutboxRelay({ store: source, cache, batchSize: 100 }).runOnce();
  }
  expect(run.claimed).toBe(50);
  expect(run.copied).toHaveLength(30); // the 20 the dead relay wrote are not written again
  expect(await outboxSize()).toBe(0);
  const copies = await Promise.all(keys.map((key) => cache.get(key)));
  expect(copies.every((copy) => copy?.state === 'completed')).toBe(true);
});

test('CachedStore reads the cache first and PostgreSQL on a miss; writes go to PostgreSQL', async () => {
  let sourceAcquires = 0;
  const counting = new Proxy(source, {
    get(target, property, receiver) {
      if (property === 'acquire') {
        return (...args: Parameters<PostgresStore['acquire']>) => {
          sourceAcquires++;
          return target.acquire(...args);
        };
      }
      const value = Reflect.get(target, property, receiver);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  const store = new CachedStore({ cache, source: counting });
  const lock = { fingerprint: 'f', lockTimeoutMs: 30_000 };
  const first = await store.acquire('cached-1', lock);
  if (first.status !== 'acquired') throw new Error('expected acquired');
  await store.complete(
    'cached-1',
    first.token,
    { status: 200, headers: {}, body: Buffer.from('hi') },
    60_000,
  );
  // Not relayed yet: the miss goes to PostgreSQL, which has it.
  const miss = await store.acquire('cached-1', lock);
  expect(miss.status).toBe('completed');
  expect(sourceAcquires).toBe(2);
  await new OutboxRelay({ store: source, cache, batchSize: 100 }).runOnce();
  const hit = await store.acquire('cached-1', lock);
  expect(hit.status).toBe('completed');
  if (hit.status === 'completed') expect(Buffer.from(hit.response.body).toString()).toBe('hi');
  expect(sourceAcquires).toBe(2); // served by Redis
});

test('the relay loop runs until stopped', async () => {
  await completeRecords('loop', 30);
  const relay = new OutboxRelay({ store: source, cache, batchSize: 10, interval: 20 }).start();
  for (let i = 0; i < 100 && (await outboxSize()) > 0; i++)
    await new Promise((resolve) => setTimeout(resolve, 20));
  await relay.stop();
  expect(await outboxSize()).toBe(0);
});
