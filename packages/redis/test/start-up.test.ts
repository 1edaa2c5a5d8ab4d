/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { idempotency } from '@oncely/express';
import express from 'express';
import Redis from 'ioredis';
import Redis6 from 'ioredis-6';
import { createClient } from 'redis';
import request from 'supertest';
import { RedisStore } from '../src';

// A request that arrives the moment the app starts, before the client has connected: with the settings the docs
// recommend (no offline queue) the store waits for the client's first connection instead of failing with 503.
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:${randomUUID()}:`;
jest.setTimeout(20_000);

afterAll(async () => {
  const cleaner = new Redis(url);
  const keys = await cleaner.keys(`${prefix}*`);
  if (keys.length > 0) await cleaner.del(...keys);
  await cleaner.quit();
});

function appOn(store: RedisStore) {
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store }));
  let runs = 0;
  app.post('/orders', (_req, res) => {
    runs++;
    res.status(201).json({ run: runs });
  });
  return { app, runs: () => runs };
}

/** The options these tests set, valid for ioredis 5 and 6 alike. */
interface ClientOptions {
  commandTimeout: number;
  maxRetriesPerRequest: number;
  enableOfflineQueue: boolean;
  lazyConnect?: boolean;
  retryStrategy?: () => number;
}

const recommended: ClientOptions = {
  commandTimeout: 2000,
  maxRetriesPerRequest: 1,
  enableOfflineQueue: false,
};

describe.each([
  ['ioredis 5', (options: ClientOptions, at = url) => new Redis(at, options)],
  ['ioredis 6', (options: ClientOptions, at = url) => new Redis6(at, options) as unknown as Redis],
] as const)('%s, not yet connected', (name, createClient) => {
  test.each([[false], [true]])(
    'lazyConnect: %s: the first request is served, then replayed',
    async (lazyConnect) => {
      const client = createClient({ ...recommended, lazyConnect });
      client.on('error', () => {});
      try {
        const { app, runs } = appOn(new RedisStore({ client, prefix: `${prefix}${name}:${lazyConnect}:` }));
        expect(client.status).not.toBe('ready');
        const first = await request(app).post('/orders').set('Idempotency-Key', 'k1').send({ n: 1 });
        expect(first.status).toBe(201);
        const again = await request(app).post('/orders').set('Idempotency-Key', 'k1').send({ n: 1 });
        expect(again.status).toBe(201);
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(runs()).toBe(1);
      } finally {
        client.disconnect();
      }
    },
  );

  test('a Redis that cannot be reached still fails the request within the command timeout, as a 503', async () => {
    const client = createClient(
      { ...recommended, commandTimeout: 500, retryStrategy: () => 100 },
      'redis://127.0.0.1:1',
    );
    client.on('error', () => {});
    try {
      const { app, runs } = appOn(new RedisStore({ client, prefix: `${prefix}${name}:down:` }));
      const res = await request(app).post('/orders').set('Idempotency-Key', 'k1').send({});
      expect(res.status).toBe(503);
      expect(runs()).toBe(0);
    } finally {
      client.disconnect();
    }
  });
});

test('node-redis, connect() called but not awaited: the first command waits for the connection', async () => {
  const client = createClient({ url, disableOfflineQueue: true, commandOptions: { timeout: 2000 } });
  client.on('error', () => {});
  const connecting = client.connect();
  try {
    const store = new RedisStore({ client, prefix: `${prefix}node-redis:` });
    expect(client.isReady).toBe(false);
    // Sent in the same turn as connect(): node-redis alone would refuse it (ClientOfflineError).
    const acquired = await store.acquire('k1', { fingerprint: 'f', lockTimeoutMs: 10_000 });
    expect(acquired.status).toBe('acquired');
  } finally {
    await connecting.catch(() => {});
    client.destroy();
  }
});
