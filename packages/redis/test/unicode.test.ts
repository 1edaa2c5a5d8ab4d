/**
 * @services redis
 */
import { randomBytes } from 'node:crypto';
import { IdempotencyKeyError, idempotent } from '@oncely/core';
import { idempotency } from '@oncely/express';
import express from 'express';
import Redis from 'ioredis';
import request from 'supertest';
import { RedisStore } from '../src';

// A lone surrogate (half of a UTF-16 pair) has no UTF-8 form: Redis gets U+FFFD in its place, so JS strings that
// differ only there are one Redis key, and a fingerprint holding one does not read back as itself. Keys and scopes
// with one are refused; fingerprints are compared as Redis gives them back.

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-unicode-${randomBytes(4).toString('hex')}:`;
let client: Redis;
let store: RedisStore;

beforeAll(() => {
  client = new Redis(url);
  store = new RedisStore({ client, prefix });
});
afterAll(async () => {
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  await store.close();
  await client.quit();
});

test('two keys that differ only in a lone surrogate are refused, not run as one (the second was a replay of the first)', async () => {
  const ran: string[] = [];
  const pay = idempotent(async (id: string) => ran.push(id), { store, key: (id) => id });
  await expect(pay('order-\uD800')).rejects.toThrow(IdempotencyKeyError);
  await expect(pay('order-\uDBFF')).rejects.toThrow(/lone surrogate/);
  expect(ran).toEqual([]);
  expect(await client.keys(`${prefix}order-*`)).toEqual([]);
  // A well-formed pair is an ordinary key.
  await pay('order-\uD83D\uDE00');
  await pay('order-\uD83D\uDE00');
  expect(ran).toEqual(['order-\uD83D\uDE00']);
});

test('a fingerprint with a lone surrogate matches itself on a retry (it was a mismatch)', async () => {
  let runs = 0;
  const charge = idempotent(
    async (_id: string, note: string) => {
      runs++;
      return note.length;
    },
    { store, key: (id) => id, fingerprint: (_id, note) => note },
  );
  // A note cut in the middle of an emoji, as a fingerprint that slices text would.
  const note = 'paid \uD83D';
  expect(await charge('fp-1', note)).toBe(6);
  expect(await charge('fp-1', note)).toBe(6);
  expect(runs).toBe(1);
});

test('an HTTP scope with a lone surrogate answers 500 problem+json, and the handler does not run', async () => {
  let runs = 0;
  const app = express();
  app.use(express.json());
  app.use(idempotency({ store, scope: (req) => `${String(req.headers['x-tenant'] ?? '')}\uDC00` }));
  app.post('/charges', (_req, res) => {
    runs++;
    res.status(201).json({ ok: true });
  });
  const res = await request(app).post('/charges').set('Idempotency-Key', 'scoped').send({});
  expect(res.status).toBe(500);
  expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
  expect(runs).toBe(0);
});
