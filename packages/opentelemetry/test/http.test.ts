import type { Server } from 'node:http';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin } from '@oncely/fastify';
import { otel } from '@oncely/opentelemetry';
import { sleep, waitUntil } from '@oncely/testing';
import express from 'express';
import Fastify from 'fastify';
import request from 'supertest';
import { FlakyStore, gate, telemetry, tracedRequest, tracedServer } from './helpers';

// Every HTTP outcome produced by real requests through Express and Fastify, with the real OpenTelemetry SDK
// (in-memory exporters) reading what otel() reports. Keys and scope carry "SECRET" so the last test can prove
// that none of it reaches an attribute.

const t = telemetry();
afterAll(() => t.shutdown());

interface App {
  server: Server;
  store: FlakyStore;
  userHits: string[];
  block: () => ReturnType<typeof gate>;
  close(): Promise<void>;
}

let blocked = gate();
blocked.open();
const handlerBody = async (body: { status?: number; block?: boolean } | undefined) => {
  if (body?.block) await blocked.promise;
  return body?.status ?? 201;
};

async function expressApp(): Promise<App> {
  const store = new FlakyStore();
  const userHits: string[] = [];
  const shared = {
    store,
    scope: () => 'tenant-SECRET-SCOPE',
    hooks: { onHit: (e: { key: string }) => void userHits.push(e.key) },
    ...otel({ meterProvider: t.meterProvider }),
  };
  const app = express();
  app.use(express.json());
  const handler = async (req: express.Request, res: express.Response) => {
    res.status(await handlerBody(req.body)).json({ ok: true });
  };
  app.post('/charges', idempotency(shared), handler);
  app.post('/wait', idempotency({ ...shared, inProgress: { wait: '5s' } }), handler);
  const server = tracedServer(app);
  return {
    server,
    store,
    userHits,
    block: () => (blocked = gate()),
    close: async () => {
      server.close();
      await store.close();
    },
  };
}

async function fastifyApp(): Promise<App> {
  const store = new FlakyStore();
  const userHits: string[] = [];
  const app = Fastify({ serverFactory: (handler) => tracedServer((req, res) => handler(req, res)) });
  // otel() spread first and the user's hooks after: both still run.
  await app.register(idempotencyPlugin, {
    ...otel({ meterProvider: t.meterProvider }),
    store,
    scope: () => 'tenant-SECRET-SCOPE',
    hooks: { onHit: (e) => void userHits.push(e.key) },
    global: false,
  });
  const handler = async (req: { body: unknown }, reply: { code(n: number): { send(b: unknown): unknown } }) =>
    reply.code(await handlerBody(req.body as { status?: number; block?: boolean })).send({ ok: true });
  app.post('/charges', { config: { idempotency: {} } }, handler);
  app.post('/wait', { config: { idempotency: { inProgress: { wait: '5s' } } } }, handler);
  await app.ready();
  return {
    server: app.server,
    store,
    userHits,
    block: () => (blocked = gate()),
    close: async () => {
      await app.close();
      await store.close();
    },
  };
}

// `tracedRequest` is used by tracedServer; referenced so the import stays explicit for readers.
void tracedRequest;

describe.each([
  ['express', expressApp],
  ['fastify', fastifyApp],
])('%s', (name, makeApp) => {
  let app: App;
  let before: Record<string, number>;
  let beforeOps: Record<string, number>;
  beforeAll(async () => {
    app = await makeApp();
    before = await t.decisions();
    beforeOps = await t.storeOperations();
  });
  afterAll(() => app.close());

  const post = (path: string, key: string | undefined, body: object) => {
    const r = request(app.server).post(path).send(body);
    return key === undefined ? r : r.set('Idempotency-Key', key);
  };
  const k = (id: string) => `KEY-SECRET-${name}-${id}`;
  const delta = async () => {
    const now = await t.decisions();
    const out: Record<string, number> = {};
    for (const [id, n] of Object.entries(now)) if (n - (before[id] ?? 0) > 0) out[id] = n - (before[id] ?? 0);
    return out;
  };

  test('every outcome is counted once, with its adapter kind', async () => {
    expect((await post('/charges', k('1'), { a: 1 })).status).toBe(201);
    const replay = await post('/charges', k('1'), { a: 1 });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect((await post('/charges', k('1'), { a: 2 })).status).toBe(422);
    expect((await post('/charges', 'x'.repeat(300), { a: 1 })).status).toBe(400);
    expect((await post('/charges', k('2'), { status: 500 })).status).toBe(500);

    // In flight: one execution held open, a duplicate gets 409.
    app.block();
    const first = post('/charges', k('3'), { block: true }).then((r) => r);
    await waitUntil(async () => (await t.active('http')) === 1, 'one execution in flight');
    expect((await post('/charges', k('3'), { block: true })).status).toBe(409);
    blocked.open();
    expect((await first).status).toBe(201);
    expect(await t.active('http')).toBe(0);

    // Wait mode: the duplicate waits for the first and replays it.
    app.block();
    const waiting = post('/wait', k('4'), { block: true }).then((r) => r);
    await waitUntil(async () => (await t.active('http')) === 1, 'the first execution in flight');
    const second = post('/wait', k('4'), { block: true }).then((r) => r);
    await sleep(150);
    blocked.open();
    expect((await waiting).status).toBe(201);
    expect((await second).headers['idempotent-replayed']).toBe('true');

    app.store.failAcquire = true;
    expect((await post('/charges', k('5'), { a: 1 })).status).toBe(503);
    app.store.failAcquire = false;

    app.store.fenceComplete = true;
    expect((await post('/charges', k('6'), { a: 1 })).status).toBe(201);
    app.store.fenceComplete = false;

    expect(await delta()).toEqual({
      'http:executed': 5,
      'http:replayed': 2,
      'http:mismatch': 1,
      'http:rejected': 1,
      'http:released': 1,
      'http:conflict': 1,
      'http:store_error': 1,
      'http:fenced': 1,
    });
    // The user's own hooks ran beside otel()'s.
    expect(app.userHits).toHaveLength(2);
  });

  test('store operations are timed by operation and result; the wait is timed; nothing is left in flight', async () => {
    const now = await t.storeOperations();
    const ops = (id: string) => (now[id] ?? 0) - (beforeOps[id] ?? 0);
    expect(ops('acquire:error')).toBe(1);
    expect(ops('acquire:ok')).toBeGreaterThanOrEqual(10);
    expect(ops('complete:ok')).toBe(4); // 1, 3, 4, and 6 (refused: the store answered false)
    expect(ops('release:ok')).toBe(1);
    // The operation, and on a failure what the store threw (its class): nothing else, and never a key.
    const points = (await t.metrics()).get('oncely.store.operation.duration') ?? [];
    const failed = points.filter((p) => p.attributes['error.type'] !== undefined);
    expect(failed.map((p) => p.attributes)).toEqual([
      { 'oncely.store.operation': 'acquire', 'error.type': 'StoreDownError' },
    ]);
    for (const p of points) {
      if (!failed.includes(p)) expect(Object.keys(p.attributes)).toEqual(['oncely.store.operation']);
    }

    const waits = (await t.metrics()).get('oncely.wait.duration') ?? [];
    const replayedWait = waits.find(
      (p) => p.attributes['oncely.outcome'] === 'replayed' && p.attributes['oncely.adapter'] === 'http',
    );
    const histogram = replayedWait?.value as { count: number; sum: number };
    expect(histogram.count).toBeGreaterThanOrEqual(1);
    expect(histogram.sum).toBeGreaterThan(0.1);
    expect(await t.active('http')).toBe(0);
  });

  test('the server span carries the outcome, and each store operation is its child span', async () => {
    const spans = t.spans();
    const servers = spans.filter((s) => s.name === 'POST' && s.attributes['oncely.outcome'] !== undefined);
    const outcomes = servers.map((s) => s.attributes['oncely.outcome']);
    for (const outcome of ['executed', 'replayed', 'mismatch', 'rejected', 'conflict', 'store_error']) {
      expect(outcomes).toContain(outcome);
    }
    const replayed = servers.find((s) => s.attributes['oncely.outcome'] === 'replayed');
    expect(replayed?.attributes['oncely.replayed']).toBe(true);
    expect(
      servers.find((s) => s.attributes['oncely.outcome'] === 'executed')?.attributes['oncely.replayed'],
    ).toBe(false);
    const storeSpans = spans.filter((s) => s.name.startsWith('oncely.store '));
    expect(storeSpans.length).toBeGreaterThan(0);
    const serverIds = new Set(spans.filter((s) => s.name === 'POST').map((s) => s.spanContext().spanId));
    for (const s of storeSpans) {
      expect(serverIds.has(s.parentSpanContext?.spanId ?? '')).toBe(true);
      expect(s.attributes['oncely.store.kind']).toBe('FlakyStore');
    }
    expect(storeSpans.some((s) => s.status.code === 2 && s.name === 'oncely.store acquire')).toBe(true);
    // A failed operation's span says what the store threw; no other span has an error.type.
    for (const s of storeSpans) {
      expect(s.attributes['error.type']).toBe(s.status.code === 2 ? 'StoreDownError' : undefined);
    }
    // A released and a fenced request say so on their span.
    const events = spans.flatMap((s) => s.events.map((e) => e.name));
    expect(events).toEqual(expect.arrayContaining(['oncely.released', 'oncely.fenced']));
  });
});

test('no idempotency key or scope value appears in any attribute', async () => {
  const values = await t.everyAttributeValue();
  expect(values.length).toBeGreaterThan(20);
  expect(values.filter((v) => /SECRET|xxxxxxxx/.test(v))).toEqual([]);
});
