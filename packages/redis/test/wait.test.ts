/**
 * @services redis-server
 */
import { idempotency } from '@oncely/express';
import { type PrivateRedis, startRedis } from '@oncely/testing';
import express from 'express';
import Redis from 'ioredis';
import Redis6 from 'ioredis-6';
import request from 'supertest';
import { RedisStore } from '../src';
import { CLIENT_KINDS } from './clients';
import { commandCounts } from './monitor';

// Wait mode on Redis, on a private server so MONITOR sees only this test's commands.
jest.setTimeout(30_000);

let redis: PrivateRedis;
let client: Redis;

beforeAll(async () => {
  redis = await startRedis();
  client = new Redis(redis.url);
});
afterAll(async () => {
  await client.quit();
  await redis.stop();
});

test.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))(
  '%s: 50 waiting duplicates wake on completion through one subscription, without a busy loop',
  async (_name, kind) => {
    const connected = await kind.standalone(redis.url);
    const store = new RedisStore({ client: connected.client, prefix: `${kind.library}:${_name.at(-1)}:` });
    const app = express();
    app.use(express.json());
    app.use(idempotency({ store, inProgress: { wait: '10s' } }));
    let runs = 0;
    app.post('/slow', (_req, res) => {
      runs++;
      // Long enough that waiters which were not woken would poll (25ms doubling) several times.
      setTimeout(() => res.status(201).json({ run: runs }), 1500);
    });

    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    let responses: request.Response[] = [];
    const commands = await commandCounts(redis.url, async () => {
      responses = await Promise.all(
        Array.from({ length: 50 }, () =>
          request(server).post('/slow').set('Idempotency-Key', 'wait-1').send({}),
        ),
      );
    });
    server.closeAllConnections();
    server.close();

    expect(runs).toBe(1);
    for (const res of responses) {
      expect(res.status).toBe(201);
      expect(res.body).toEqual({ run: 1 });
    }
    expect(commands.subscribe).toBe(1);
    // Per waiter at most: the acquire script (after its SET found the lease), watch, and an acquire after the
    // wake-up = 3 (that last one a SET now); the owner: complete. A poll loop would need several more rounds.
    expect(commands.evalsha ?? 0).toBeLessThanOrEqual(49 * 3 + 2 + 5);
    await store.close();
    await connected.close();
  },
);

test('without a working subscription, waiters still get the replay by polling', async () => {
  const pollingStore = new RedisStore({ client, prefix: 'poll:' });
  // Break the subscription path: the duplicate connection points at a closed port.
  (client as unknown as { duplicate: () => Redis }).duplicate = () =>
    new Redis({
      port: 1,
      host: '127.0.0.1',
      lazyConnect: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store: pollingStore, inProgress: { wait: '10s' } }));
  let runs = 0;
  app.post('/slow', (_req, res) => {
    runs++;
    setTimeout(() => res.status(201).json({ run: runs }), 300);
  });
  const responses = await Promise.all(
    Array.from({ length: 5 }, () => request(app).post('/slow').set('Idempotency-Key', 'poll-1').send({})),
  );
  expect(runs).toBe(1);
  for (const res of responses) expect(res.body).toEqual({ run: 1 });
  await pollingStore.close();
});

test('an ioredis client with keyPrefix: a waiter wakes on the completion, not at its timeout', async () => {
  const prefixed = new Redis(redis.url, { keyPrefix: 'app:' });
  const store = new RedisStore({ client: prefixed, prefix: 'prefixed:' });
  try {
    const acquired = await store.acquire('k', { fingerprint: 'f', lockTimeoutMs: 30_000 });
    if (acquired.status !== 'acquired') throw new Error('expected to acquire');
    const started = Date.now();
    const woken = store.waitFor('k', 20_000).then(() => Date.now() - started);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(
      await store.complete('k', acquired.token, { status: 201, headers: {}, body: new Uint8Array() }, 60_000),
    ).toBe(true);
    // The PUBLISH carried "app:prefixed:k"; matched as "prefixed:k", long before the 20 s timeout.
    expect(await woken).toBeLessThan(10_000);
    expect(await prefixed.exists('prefixed:k')).toBe(1);
  } finally {
    await store.close();
    await prefixed.quit();
  }
});

test('after close(), waitFor sleeps out its slice instead of returning at once (no busy loop in wait mode)', async () => {
  const store = new RedisStore({ client, prefix: 'closed:' });
  await store.close();
  const started = Date.now();
  await store.waitFor('k', 400);
  // At once, the engine would ask the store again straight away, thousands of times a second.
  expect(Date.now() - started).toBeGreaterThanOrEqual(350);
});

// A client made with `lazyConnect: true` (connected by its first command, or by `connect()`) hands that option to
// its duplicate: the subscriber must be connected by the store, or waiters only wake at the end of their slice.
describe.each([
  [
    'ioredis 5',
    (
      url: string,
      options: { lazyConnect: boolean; enableOfflineQueue: boolean; maxRetriesPerRequest: number },
    ) => new Redis(url, options),
  ],
  [
    'ioredis 6',
    (
      url: string,
      options: { lazyConnect: boolean; enableOfflineQueue: boolean; maxRetriesPerRequest: number },
    ) => new Redis6(url, options) as unknown as Redis,
  ],
] as const)('%s subscriber', (name, createClient) => {
  test.each([[true], [false]])(
    'lazyConnect: %s: a waiter wakes on the completion, not at its timeout',
    async (lazyConnect) => {
      const lazy = createClient(redis.url, {
        lazyConnect,
        enableOfflineQueue: false,
        maxRetriesPerRequest: 1,
      });
      const store = new RedisStore({ client: lazy, prefix: `lazy-${name.at(-1)}-${lazyConnect}:` });
      try {
        await lazy.connect().catch(() => {}); // connected by hand when lazy, as the example does; a no-op otherwise
        if (lazy.status !== 'ready') await new Promise((resolve) => lazy.once('ready', resolve));
        const acquired = await store.acquire('k', { fingerprint: 'f', lockTimeoutMs: 30_000 });
        if (acquired.status !== 'acquired') throw new Error('expected to acquire');
        const started = Date.now();
        const woken = store.waitFor('k', 20_000).then(() => Date.now() - started);
        await new Promise((resolve) => setTimeout(resolve, 300));
        await store.complete(
          'k',
          acquired.token,
          { status: 201, headers: {}, body: new Uint8Array() },
          60_000,
        );
        // Woken by the message: long before the 20 s slice a waiter without a subscriber sleeps out.
        expect(await woken).toBeLessThan(10_000);
      } finally {
        await store.close();
        lazy.disconnect();
      }
    },
  );
});
