/**
 * @services redis-server
 */
import { randomUUID } from 'node:crypto';
import { type PrivateRedis, startRedis } from '@oncely/testing';
import Redis from 'ioredis';
import { RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { commandCounts } from './monitor';
import { stepCases } from './steps-cases';

// On a private redis-server, so that MONITOR counts no other client's commands.
let redis: PrivateRedis;

beforeAll(async () => {
  redis = await startRedis();
});
afterAll(async () => {
  await redis.stop();
});

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('RedisStore on %s', (_name, kind) => {
  let connected: ConnectedClient;
  let store: RedisStore;

  beforeAll(async () => {
    connected = await kind.standalone(redis.url);
    store = new RedisStore({ client: connected.client, prefix: `steps:${kind.name}:` });
  });
  afterAll(async () => {
    await store.close();
    await connected.close();
  });

  stepCases(() => store);

  test('recordStep is one round trip (one script call), the first and every later step', async () => {
    const key = `round-trips-${randomUUID()}`;
    const acquired = await store.acquire(key, { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error(acquired.status);
    // Loaded once before counting (the very first call of a script is EVALSHA → NOSCRIPT → EVAL).
    await store.recordStep(key, acquired.token, 'warm-up', '0', 60_000);
    for (const name of ['first', 'second', 'warm-up']) {
      const counts = await commandCounts(redis.url, () =>
        store.recordStep(key, acquired.token, name, '"v"', 60_000),
      );
      expect(counts).toEqual({ evalsha: 1 });
    }
    // A refused step (another token) is one round trip as well, and writes nothing.
    const refused = await commandCounts(redis.url, async () => {
      expect(await store.recordStep(key, `${randomUUID()}fp`, 'x', '1', 60_000)).toBe(false);
    });
    expect(refused).toEqual({ evalsha: 1 });
  });
});

test('a record with steps stays in its own key: nothing else is written', async () => {
  const client = new Redis(redis.url);
  try {
    const prefix = `own-key-${randomUUID()}:`;
    const store = new RedisStore({ client, prefix });
    const acquired = await store.acquire('k', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error(acquired.status);
    await store.recordStep('k', acquired.token, 'a', '1', 60_000);
    await store.recordStep('k', acquired.token, 'b', '2', 60_000);
    await store.release('k', acquired.token);
    expect(await client.keys(`${prefix}*`)).toEqual([`${prefix}k`]);
  } finally {
    client.disconnect();
  }
});
