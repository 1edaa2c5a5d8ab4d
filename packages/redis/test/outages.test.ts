/**
 * @services redis-server
 */
import type { AddressInfo } from 'node:net';
import { idempotency } from '@oncely/express';
import { type PrivateRedis, startRedis } from '@oncely/testing';
import express from 'express';
import request from 'supertest';
import { RedisStore } from '../src';
import { CLIENT_KINDS, type ConnectedClient } from './clients';

// Outages on a private redis-server per client: killed (SIGKILL), restarted, paused (SIGSTOP). Each client is
// configured as docs/stores/redis.md recommends for it, so that every outage fails fast.
jest.setTimeout(60_000);

// Each command's answer must come within this while the server is up, even when the test process is starved on a
// loaded machine (at 500 ms, requests before and after the outages failed with 503).
const COMMAND_TIMEOUT = 1000;

async function until(check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error('condition not met in 20 s');
}

describe.each(CLIENT_KINDS.map((kind) => [kind.name, kind] as const))('RedisStore on %s', (_name, kind) => {
  let redis: PrivateRedis;
  let connected: ConnectedClient;
  let url: string;
  let server: import('node:http').Server;
  const runs = new Map<string, number>();

  beforeAll(async () => {
    redis = await startRedis();
    connected = await kind.standalone(redis.url, COMMAND_TIMEOUT);
    const app = express();
    app.use(express.json());
    app.use(idempotency({ store: new RedisStore({ client: connected.client }) }));
    app.post('/charges', (req, res) => {
      const key = req.idempotencyKey ?? '';
      runs.set(key, (runs.get(key) ?? 0) + 1);
      res.status(201).json({ ok: true });
    });
    server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await connected.close();
    server.closeAllConnections();
    server.close();
    await redis.stop();
  });

  const post = (key: string) => request(url).post('/charges').set('Idempotency-Key', key).send({ amount: 1 });

  test('killed: covered requests get 503 fast and the handler does not run; restarted: served again, same app', async () => {
    await post('before').expect(201);
    await redis.kill();
    const started = Date.now();
    const down = await Promise.all(['k1', 'k2', 'k1', 'before'].map(post));
    for (const res of down) {
      expect(res.status).toBe(503);
      expect(res.headers['content-type']).toMatch(/problem\+json/);
    }
    // Generous bound: a client stuck retrying or queueing would take far longer.
    expect(Date.now() - started).toBeLessThan(COMMAND_TIMEOUT * 10);
    expect(runs.get('k1')).toBeUndefined();
    expect(runs.get('k2')).toBeUndefined();

    await redis.restart();
    await until(async () => (await post('k1')).status === 201);
    const replay = await post('k1');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs.get('k1')).toBe(1);
    await post('k2').expect(201);
    expect(runs.get('k2')).toBe(1);
  });

  test('paused (SIGSTOP): 503 after the command timeout, no hang; resumed: served again', async () => {
    await until(async () => (await post('p0')).status === 201);
    redis.pause();
    try {
      const started = Date.now();
      const res = await post('p1');
      const elapsed = Date.now() - started;
      expect(res.status).toBe(503);
      expect(elapsed).toBeGreaterThanOrEqual(COMMAND_TIMEOUT - 50);
      expect(elapsed).toBeLessThan(COMMAND_TIMEOUT * 10);
      expect(runs.get('p1')).toBeUndefined();
    } finally {
      redis.resume();
    }
    await until(async () => (await post('p1')).status === 201);
    expect((await post('p1')).headers['idempotent-replayed']).toBe('true');
    expect(runs.get('p1')).toBe(1);
  });

  test('in none of the outages did a handler run twice for one key', () => {
    expect([...runs.values()].every((n) => n === 1)).toBe(true);
    expect(runs.size).toBeGreaterThanOrEqual(4);
  });
});
