import { createHash } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { createApp, FAIL_HEADER } from '../app';

// The demo's answers (see server.ts): first call, replay, 409 while running, 422 on a different body; and the
// route with steps, whose retry after a failure between the charge and the email charges once.

/** keyFor(name) under a key without scope, by the formula docs/steps.md gives. */
const keyFor = (key: string, name: string) =>
  createHash('sha256')
    .update(JSON.stringify(['oncely.keyFor.v1', key, name]))
    .digest('base64url');
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

  const order = { amount: 1500, currency: 'eur', email: 'ada@example.com' };
  const provider = async () =>
    (await request(url).get('/provider/charges')).body as Record<
      string,
      { id: string; charges: number; requests: number }
    >;
  const count = (prefix: string) => lines.filter((line) => line.startsWith(prefix)).length;

  test('the provider route answers the same charge for a repeated Idempotency-Key, and needs one', async () => {
    const charge = () =>
      request(url).post('/provider/charges').set('Idempotency-Key', 'provider-test-1').send(body);
    const first = await charge();
    const again = await charge();
    expect(first.status).toBe(201);
    expect(again.body.id).toBe(first.body.id);
    expect((await provider())['provider-test-1']).toMatchObject({
      id: first.body.id,
      charges: 1,
      requests: 2,
    });
    expect((await request(url).post('/provider/charges').send(body)).status).toBe(400);
  });

  test('a retry after a failure between the charge and the email charges once and answers its id', async () => {
    const key = 'demo-test-order-1';
    const failed = await request(url)
      .post('/orders')
      .set('Idempotency-Key', key)
      .set(FAIL_HEADER, 'after-charge')
      .send(order);
    expect(failed.status).toBe(500);
    const charged = (await provider())[keyFor(key, 'charge')];
    expect(charged).toMatchObject({ charges: 1, requests: 1 });
    expect(count('email for order')).toBe(0);

    const emailsBefore = count('email for order');
    const ordersBefore = count('order ');
    const retry = await request(url).post('/orders').set('Idempotency-Key', key).send(order);
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    expect(retry.body).toMatchObject({ chargeId: charged?.id, amount: 1500, emailQueued: true });
    // The provider was not called again; the order was not written again; the email step ran once.
    expect((await provider())[keyFor(key, 'charge')]).toEqual(charged);
    expect(count('order ') - ordersBefore).toBe(0);
    expect(count('email for order') - emailsBefore).toBe(1);
    expect(lines).toEqual(
      expect.arrayContaining([
        `key ${key}: step order recorded by an earlier attempt, not run again`,
        `key ${key}: step charge recorded by an earlier attempt, not run again`,
        `key ${key}: step email ran and was recorded`,
      ]),
    );

    const replay = await request(url).post('/orders').set('Idempotency-Key', key).send(order);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text).toBe(retry.text);
    expect((await provider())[keyFor(key, 'charge')]?.requests).toBe(1);
  });

  test("a failure after the provider charged, before the step's record: keyFor makes the retry get that charge", async () => {
    const key = 'demo-test-order-2';
    const failed = await request(url)
      .post('/orders')
      .set('Idempotency-Key', key)
      .set(FAIL_HEADER, 'charge-not-recorded')
      .send(order);
    expect(failed.status).toBe(500);
    const charged = (await provider())[keyFor(key, 'charge')];
    expect(charged).toMatchObject({ charges: 1, requests: 1 });

    const retry = await request(url).post('/orders').set('Idempotency-Key', key).send(order);
    expect(retry.status).toBe(201);
    expect(retry.body.chargeId).toBe(charged?.id);
    expect((await provider())[keyFor(key, 'charge')]).toMatchObject({ charges: 1, requests: 2 });
  });

  test('POST /orders without a key is refused by the route: its steps need one', async () => {
    const before = Object.keys(await provider()).length;
    const response = await request(url).post('/orders').send(order);
    expect(response.status).toBe(400);
    expect(Object.keys(await provider()).length).toBe(before);
  });

  test('GET /metrics counts the decisions above by outcome, with no key in any label', async () => {
    const metrics = await request(url).get('/metrics');
    expect(metrics.status).toBe(200);
    /** The HTTP series of a counter by its outcome label (`oncely_outcome`, `oncely_step_outcome`). */
    const series = (metric: string, label: string, outcome: string) =>
      Number(
        metrics.text.match(
          new RegExp(`^${metric}\\{${label}="${outcome}",oncely_adapter="http"[^}]*\\} (\\d+)`, 'm'),
        )?.[1],
      );
    const count = (outcome: string) => series('oncely_decisions_total', 'oncely_outcome', outcome);
    expect(count('executed')).toBeGreaterThanOrEqual(2);
    expect(count('replayed')).toBeGreaterThanOrEqual(2);
    expect(count('conflict')).toBe(1);
    expect(count('mismatch')).toBe(1);
    expect(count('rejected')).toBe(1);
    expect(metrics.text).toMatch(/^oncely_store_operation_duration_count\{/m);
    // The two orders: order 1 ran order and charge, then (retry) replayed both and ran email; order 2 ran order,
    // then (retry) replayed it and ran charge and email.
    const steps = (outcome: string) => series('oncely_steps_total', 'oncely_step_outcome', outcome);
    expect(steps('run')).toBe(6);
    expect(steps('replayed')).toBe(3);
    expect(metrics.text).not.toMatch(/demo-test/);
  });
});
