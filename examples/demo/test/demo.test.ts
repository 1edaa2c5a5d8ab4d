import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { createApp } from '../app';

// The demo's four answers (see server.ts): first call, replay, 409 while running, 422 on a different body.
describe('demo app', () => {
  let server: Server;
  let url: string;
  const lines: string[] = [];

  beforeAll(async () => {
    server = createApp({ slowChargeMs: 500, log: (line) => lines.push(line) }).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const charges = () => lines.filter((line) => line.startsWith('charge ')).length;
  const body = { amount: 1000, currency: 'eur' };

  test('first call 201, replay with Idempotent-Replayed: true, 422 on a different body', async () => {
    const before = charges();
    const first = await request(url).post('/charges').set('Idempotency-Key', 'demo-test-1').send(body);
    expect(first.status).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(first.body).toMatchObject({ id: expect.stringMatching(/^ch_/), amount: 1000, currency: 'eur' });

    const replay = await request(url).post('/charges').set('Idempotency-Key', 'demo-test-1').send(body);
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text).toBe(first.text);

    const mismatch = await request(url)
      .post('/charges')
      .set('Idempotency-Key', 'demo-test-1')
      .send({ amount: 9999, currency: 'eur' });
    expect(mismatch.status).toBe(422);
    expect(mismatch.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(mismatch.body.type).toBe('https://oncely.dev/problems/key-reused');

    expect(charges() - before).toBe(1);
  });

  test('a duplicate while the slow route runs gets 409 with Retry-After; afterwards it replays', async () => {
    const before = charges();
    const slow = () => request(url).post('/slow-charges').set('Idempotency-Key', 'demo-test-2').send(body);
    const first = slow().then((r) => r);
    await new Promise((resolve) => setTimeout(resolve, 150));
    const conflict = await slow();
    expect(conflict.status).toBe(409);
    expect(conflict.body.type).toBe('https://oncely.dev/problems/request-in-progress');
    expect(Number(conflict.headers['retry-after'])).toBeGreaterThanOrEqual(1);

    const done = await first;
    expect(done.status).toBe(201);
    const replay = await slow();
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text).toBe(done.text);
    expect(charges() - before).toBe(1);
  });

  test('an invalid key gets 400; no key runs the handler every time', async () => {
    const invalid = await request(url).post('/charges').set('Idempotency-Key', 'not a valid key').send(body);
    expect(invalid.status).toBe(400);
    expect(invalid.body.type).toBe('https://oncely.dev/problems/key-invalid');

    const a = await request(url).post('/charges').send(body);
    const b = await request(url).post('/charges').send(body);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(a.body.id).not.toBe(b.body.id);
  });

  test('GET /metrics counts the decisions above by outcome, with no key in any label', async () => {
    const metrics = await request(url).get('/metrics');
    expect(metrics.status).toBe(200);
    const count = (outcome: string) =>
      Number(
        metrics.text.match(
          new RegExp(
            `^oncely_decisions_total\\{oncely_outcome="${outcome}",oncely_adapter="http"[^}]*\\} (\\d+)`,
            'm',
          ),
        )?.[1],
      );
    expect(count('executed')).toBeGreaterThanOrEqual(2);
    expect(count('replayed')).toBeGreaterThanOrEqual(2);
    expect(count('conflict')).toBe(1);
    expect(count('mismatch')).toBe(1);
    expect(count('rejected')).toBe(1);
    expect(metrics.text).toMatch(/^oncely_store_operation_duration_count\{/m);
    expect(metrics.text).not.toMatch(/demo-test/);
  });
});
