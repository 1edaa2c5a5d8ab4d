/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { scopeByHeader } from '@oncely/core';
import { idempotency } from '@oncely/express';
import express from 'express';
import Redis from 'ioredis';
import request from 'supertest';
import { RedisStore } from '../src';

// scopeByHeader on a real Redis: two API keys sending one Idempotency-Key are two records, and what Redis holds
// (key names and values) never contains either API key.
const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-scope:${randomUUID()}:`;
let client: Redis;

beforeAll(() => {
  client = new Redis(url, { maxRetriesPerRequest: 1 });
});
afterAll(async () => {
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  await client.quit();
});

test('two API keys, one Idempotency-Key: two executions, two records, no credential stored', async () => {
  const store = new RedisStore({ client, prefix });
  const app = express();
  let executions = 0;
  app.use(express.json());
  app.use(
    idempotency({
      store,
      scope: scopeByHeader('authorization', { secret: 'redis-test-secret-0123456789abcdef' }),
    }),
  );
  app.post('/charges', (req, res) => {
    executions++;
    res.status(201).json({ charge: executions, caller: String(req.headers['x-caller']) });
  });

  const apiKeyA = `sk_live_A_${randomUUID()}`;
  const apiKeyB = `sk_live_B_${randomUUID()}`;
  const send = (apiKey: string, caller: string) =>
    request(app)
      .post('/charges')
      .set('Authorization', `Bearer ${apiKey}`)
      .set('Idempotency-Key', 'order-42')
      .set('x-caller', caller)
      .send({ amount: 10 });

  const a = await send(apiKeyA, 'A');
  const b = await send(apiKeyB, 'B');
  const replayA = await send(apiKeyA, 'A');
  expect([a.status, b.status, replayA.status]).toEqual([201, 201, 201]);
  expect(b.body).toEqual({ charge: 2, caller: 'B' });
  expect(b.headers['idempotent-replayed']).toBeUndefined();
  expect(replayA.headers['idempotent-replayed']).toBe('true');
  expect(replayA.body).toEqual({ charge: 1, caller: 'A' });
  expect(executions).toBe(2);

  const stored = await client.keys(`${prefix}*`);
  expect(stored).toHaveLength(2);
  for (const key of stored) {
    expect(key).toMatch(/authorization:[A-Za-z0-9_-]{43} order-42/);
    const contents = JSON.stringify(
      (await client.type(key)) === 'hash' ? await client.hgetall(key) : await client.get(key),
    );
    for (const secret of [apiKeyA, apiKeyB, 'sk_live']) {
      expect(key).not.toContain(secret);
      expect(contents).not.toContain(secret);
    }
  }
});
