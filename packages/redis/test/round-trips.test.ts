/**
 * @services redis-server
 */
import { idempotency } from '@oncely/express';
import { type PrivateRedis, startRedis } from '@oncely/testing';
import express from 'express';
import Redis from 'ioredis';
import request from 'supertest';
import { RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';
import { commandCounts } from './monitor';

// Counted on a private redis-server, so no other client's commands are in the numbers. `client` is an ioredis
// connection for inspecting the server; each client RedisStore supports runs the app in turn.
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

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('RedisStore on %s', (_name, kind) => {
  let connected: ConnectedClient;
  let app: express.Express;

  beforeAll(async () => {
    connected = await kind.standalone(redis.url);
    app = express();
    app.use(express.json());
    app.use(idempotency({ store: new RedisStore({ client: connected.client }) }));
    app.post('/charges', (req, res) => void res.status(201).json({ amount: req.body.amount }));
    // Load the scripts once (the very first call per script is EVALSHA → NOSCRIPT → EVAL).
    await request(app).post('/charges').set('Idempotency-Key', 'warm-up').send({ amount: 0 });
    await request(app).post('/charges').set('Idempotency-Key', 'warm-up').send({ amount: 0 });
  });
  afterAll(async () => {
    await connected.close();
  });

  test('a first execution costs two round trips (acquire, complete), a replay one; neither runs the acquire script', async () => {
    const first = await commandCounts(redis.url, () =>
      request(app)
        .post('/charges')
        .set('Idempotency-Key', `first-${kind.name.replace(' ', '-')}`)
        .send({ amount: 1 })
        .expect(201),
    );
    expect(first).toEqual({ set: 1, evalsha: 1 });

    const replay = await commandCounts(redis.url, async () => {
      const res = await request(app)
        .post('/charges')
        .set('Idempotency-Key', `first-${kind.name.replace(' ', '-')}`)
        .send({ amount: 1 });
      expect(res.headers['idempotent-replayed']).toBe('true');
    });
    expect(replay).toEqual({ set: 1 });

    const mismatchAndNoKey = await commandCounts(redis.url, async () => {
      await request(app)
        .post('/charges')
        .set('Idempotency-Key', `first-${kind.name.replace(' ', '-')}`)
        .send({ amount: 2 })
        .expect(422);
      await request(app).post('/charges').send({ amount: 2 }).expect(201); // no key: Redis is not asked
    });
    expect(mismatchAndNoKey).toEqual({ set: 1 });
  });

  test('after the server loses its script cache (restart, failover), NOSCRIPT is handled', async () => {
    await redis.cli('script', 'flush');
    await request(app)
      .post('/charges')
      .set('Idempotency-Key', `after-flush-${kind.name.replace(' ', '-')}`)
      .send({ amount: 3 })
      .expect(201);
    const replay = await request(app)
      .post('/charges')
      .set('Idempotency-Key', `after-flush-${kind.name.replace(' ', '-')}`)
      .send({ amount: 3 });
    expect(replay.headers['idempotent-replayed']).toBe('true');
  });
});

test('a record is one Redis key holding the body as raw bytes', async () => {
  const body = Buffer.alloc(2048);
  for (let i = 0; i < body.length; i++) body[i] = i % 256;
  const store = new RedisStore({ client, prefix: 'raw:' });
  const acquired = await store.acquire('bytes', { fingerprint: 'f', lockTimeoutMs: 30_000 });
  if (acquired.status !== 'acquired') throw new Error('expected acquired');
  await store.complete('bytes', acquired.token, { status: 200, headers: {}, body }, 60_000);
  expect(await client.keys('raw:*')).toEqual(['raw:bytes']);
  // The record is one string ending with the body's own bytes: no base64 or JSON inflation.
  const stored = await client.getBuffer('raw:bytes');
  expect(stored?.subarray(stored.length - body.length).equals(body)).toBe(true);
  expect(stored?.length).toBeLessThan(body.length + 100);
});

test('leases and TTLs use Redis time: the key expires by itself (PEXPIRE), no app clock involved', async () => {
  const store = new RedisStore({ client, prefix: 'ttl:' });
  const acquired = await store.acquire('lease', { fingerprint: 'f', lockTimeoutMs: 5_000 });
  if (acquired.status !== 'acquired') throw new Error('expected acquired');
  const leasePttl = await client.pttl('ttl:lease');
  expect(leasePttl).toBeGreaterThan(4_000);
  expect(leasePttl).toBeLessThanOrEqual(5_000);
  await store.complete(
    'lease',
    acquired.token,
    { status: 200, headers: {}, body: new Uint8Array() },
    3_600_000,
  );
  const ttl = await client.pttl('ttl:lease');
  expect(ttl).toBeGreaterThan(3_500_000);
});
