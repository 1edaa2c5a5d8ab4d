import { readFileSync } from 'node:fs';
import { request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { pipeline, Readable } from 'node:stream';
import { Idempotency, idempotent, MemoryStore, type StoredResponse } from '@oncely/core';
import { type AcquireOptions, consumerRuntime, type StoreTransaction } from '@oncely/core/adapter';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin } from '@oncely/fastify';
import { otel, otelHooks } from '@oncely/opentelemetry';
import { sleep, waitUntil } from '@oncely/testing';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import express from 'express';
import Fastify from 'fastify';
import request from 'supertest';
import { gate, telemetry } from './helpers';

// Regressions found in review: each test failed on the code as first written.

const t = telemetry();
afterAll(() => t.shutdown());

const delta = (before: Record<string, number>, now: Record<string, number>) => {
  const out: Record<string, number> = {};
  for (const [id, n] of Object.entries(now)) if (n - (before[id] ?? 0) > 0) out[id] = n - (before[id] ?? 0);
  return out;
};

// A route's `hooks` replace only the plugin's hooks, and a route's otel() only the plugin's observers (hooksOver).
describe('Fastify: a route that sets its own hooks or otel() keeps the other', () => {
  test("a route's own hooks do not drop the plugin's otel()", async () => {
    const store = new MemoryStore();
    const hits: string[] = [];
    const app = Fastify();
    await app.register(idempotencyPlugin, {
      store,
      scope: false,
      ...otel({ meterProvider: t.meterProvider }),
    });
    app.post(
      '/route-hooks',
      { config: { idempotency: { hooks: { onHit: (e) => void hits.push(e.key) } } } },
      async () => ({ ok: true }),
    );
    await app.ready();
    const before = await t.decisions();
    await request(app.server).post('/route-hooks').set('Idempotency-Key', 'rh-1').send({ a: 1 });
    await request(app.server).post('/route-hooks').set('Idempotency-Key', 'rh-1').send({ a: 1 });
    expect(hits).toEqual(['rh-1']);
    expect(delta(before, await t.decisions())).toEqual({ 'http:executed': 1, 'http:replayed': 1 });
    await app.close();
    await store.close();
  });

  test("a route's otel() does not drop the plugin's hooks", async () => {
    const store = new MemoryStore();
    const hits: string[] = [];
    const app = Fastify();
    await app.register(idempotencyPlugin, {
      store,
      scope: false,
      hooks: { onHit: (e) => void hits.push(e.key) },
    });
    app.post(
      '/route-otel',
      { config: { idempotency: { ...otel({ meterProvider: t.meterProvider }) } } },
      async () => ({ ok: true }),
    );
    await app.ready();
    const before = await t.decisions();
    await request(app.server).post('/route-otel').set('Idempotency-Key', 'ro-1').send({ a: 1 });
    await request(app.server).post('/route-otel').set('Idempotency-Key', 'ro-1').send({ a: 1 });
    expect(delta(before, await t.decisions())).toEqual({ 'http:executed': 1, 'http:replayed': 1 });
    expect(hits).toEqual(['ro-1']);
    await app.close();
    await store.close();
  });
});

/** A request whose client goes away once the handler has started; resolves when the socket is closed. */
function abortAfterStart(server: Server, path: string, key: string, started: Promise<void>): Promise<void> {
  return new Promise((resolve) => {
    const address = server.address() as AddressInfo;
    const req = httpRequest({
      host: '127.0.0.1',
      port: address.port,
      path,
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
    });
    req.on('error', () => resolve());
    req.on('close', () => resolve());
    req.end(JSON.stringify({ a: 1 }));
    void started.then(() => req.destroy());
  });
}

describe.each(['express', 'fastify'] as const)('%s: executions in flight return to 0', (name) => {
  test('after many requests ending every way: completed, thrown, next(err), 500, aborted, streamed, fenced, fail-open', async () => {
    const store = new FenceableStore();
    const activeBefore = (await t.active('http')) ?? 0;
    const open = new Set<string>();
    const m = otel({
      meterProvider: t.meterProvider,
      hooks: {
        onExecutionStart: (e) => void open.add(e.key),
        onExecutionEnd: (e) => void open.delete(e.key),
      },
    });
    let started = gate();
    let release = gate();
    let server: Server;
    let close: () => Promise<void>;
    const big = 'x'.repeat(4096);
    if (name === 'express') {
      const app = express();
      app.use(express.json());
      const mw = idempotency({ store, scope: false, maxBodyBytes: 1024, ...m });
      const failOpen = idempotency({ store: new DownStore(), scope: false, onStoreError: 'fail-open', ...m });
      app.post('/ok', mw, (_req, res) => void res.status(201).json({ ok: true }));
      app.post('/throw', mw, () => {
        throw new Error('boom');
      });
      app.post('/next-err', mw, (_req, _res, next) => next(new Error('boom')));
      app.post('/500', mw, (_req, res) => void res.status(500).json({ ok: false }));
      app.post('/big', mw, (_req, res) => void res.status(200).send(big));
      app.post('/stream-error', mw, (_req, res) => {
        res.write(big);
        setImmediate(() => res.destroy(new Error('stream broke')));
      });
      app.post('/slow', mw, async (_req, res) => {
        started.open();
        await release.promise;
        res.status(201).json({ ok: true });
      });
      app.post('/fail-open', failOpen, (_req, res) => void res.status(201).json({ ok: true }));
      server = app.listen(0, '127.0.0.1');
      await new Promise((r) => server.once('listening', r));
      close = async () => {
        server.closeAllConnections();
        server.close();
      };
    } else {
      const app = Fastify();
      await app.register(idempotencyPlugin, { store, scope: false, maxBodyBytes: 1024, ...m });
      app.post('/ok', async (_req, reply) => reply.code(201).send({ ok: true }));
      app.post('/throw', async () => {
        throw new Error('boom');
      });
      app.post('/next-err', (_req, reply) => void reply.send(new Error('boom')));
      app.post('/500', async (_req, reply) => reply.code(500).send({ ok: false }));
      app.post('/big', async () => big);
      app.post('/stream-error', async (_req, reply) => {
        const stream = new Readable({ read() {} });
        stream.push(big);
        setImmediate(() => stream.destroy(new Error('stream broke')));
        return reply.send(stream);
      });
      app.post('/slow', async (_req, reply) => {
        started.open();
        await release.promise;
        return reply.code(201).send({ ok: true });
      });
      app.post('/hijack', async (_req, reply) => {
        reply.hijack();
        reply.raw.end('raw');
      });
      await app.register(async (child) => {
        await child.register(idempotencyPlugin, {
          store: new DownStore(),
          scope: false,
          onStoreError: 'fail-open',
          ...m,
        });
        child.post('/fail-open', async (_req, reply) => reply.code(201).send({ ok: true }));
      });
      await app.listen({ port: 0, host: '127.0.0.1' });
      server = app.server;
      close = () => app.close();
    }
    const paths = ['/ok', '/throw', '/next-err', '/500', '/big', '/fail-open'];
    for (let round = 0; round < 5; round++) {
      await Promise.all(
        paths.map((path, i) =>
          request(server)
            .post(path)
            .set('Idempotency-Key', `${name}-${round}-${i}`)
            .send({ a: 1 })
            .then(() => {}),
        ),
      );
      await request(server)
        .post('/stream-error')
        .set('Idempotency-Key', `${name}-${round}-se`)
        .send({ a: 1 })
        .catch(() => {});
      store.fence = true;
      await request(server).post('/ok').set('Idempotency-Key', `${name}-${round}-f`).send({ a: 1 });
      store.fence = false;
      if (name === 'fastify')
        await request(server).post('/hijack').set('Idempotency-Key', `${name}-${round}-h`).send({ a: 1 });
      // The client leaves while the handler runs; the handler then finishes.
      started = gate();
      release = gate();
      await abortAfterStart(server, '/slow', `${name}-${round}-abort`, started.promise);
      release.open();
    }
    await waitUntil(async () => open.size === 0, `${name}: no execution left in flight`, 3000).catch(
      () => {},
    );
    expect([...open]).toEqual([]);
    expect(await t.active('http')).toBe(activeBefore);
    await close();
    await store.close();
  });
});

/** A MemoryStore that can refuse a completion, as after a lost lease. */
class FenceableStore extends MemoryStore {
  fence = false;
  override async complete(key: string, token: string, response: StoredResponse, ttlMs: number) {
    if (this.fence) return false;
    return super.complete(key, token, response, ttlMs);
  }
}

/** A store that is down: every acquire fails. */
class DownStore extends MemoryStore {
  override async acquire(): Promise<never> {
    throw new Error('store unreachable');
  }
}

// A handler that destroys its response with an error (stream.pipeline(source, res) with a failing source) has
// failed: the execution ends (released), and its lease is not renewed for ever.
test('express: a handler whose response stream fails (pipeline destroys res) still settles its execution', async () => {
  const store = new MemoryStore();
  const open = new Set<string>();
  const app = express();
  app.use(express.json());
  app.post(
    '/pipe',
    idempotency({
      store,
      scope: false,
      maxBodyBytes: 1024,
      lockTimeout: '300ms',
      ...otel({
        // Its own: while the bug is there this execution renews its lease for ever, into the meter it is given.
        meterProvider: new MeterProvider(),
        hooks: {
          onExecutionStart: (e) => void open.add(e.key),
          onExecutionEnd: (e) => void open.delete(e.key),
        },
      }),
    }),
    (_req, res) => {
      const source = new Readable({ read() {} });
      source.push('x'.repeat(4096));
      setImmediate(() => source.destroy(new Error('upstream broke')));
      pipeline(source, res, () => {});
    },
  );
  const server = app.listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  try {
    await request(server)
      .post('/pipe')
      .set('Idempotency-Key', 'pipe-1')
      .send({ a: 1 })
      .catch(() => {});
    await waitUntil(() => open.size === 0, 'the execution settled', 1000).catch(() => {});
    // Past two lock timeouts: a settled (released) key is free; an unsettled one is still held, renewed for ever.
    await sleep(700);
    const held = (await store.get('pipe-1'))?.state === 'in_progress';
    expect({ inFlight: [...open], held }).toEqual({ inFlight: [], held: false });
  } finally {
    server.closeAllConnections();
    server.close();
    await store.close();
  }
});

test('transactional mode: the commit and the rollback are timed as complete and release', async () => {
  const store = new TransactionalMemoryStore();
  const engine = new Idempotency({ store, transactional: true, ...otel({ meterProvider: t.meterProvider }) });
  const before = await t.storeOperations();
  const input = (key: string) => ({
    method: 'POST',
    url: '/x',
    headers: { 'idempotency-key': key },
    body: { a: 1 },
    request: {},
  });
  const ok = await engine.handle(input('tx-1'));
  if (ok.action !== 'execute') throw new Error('expected execute');
  expect(await ok.execution.complete({ status: 201, headers: {}, body: new Uint8Array() })).toBeUndefined();
  expect(ok.execution.db).toBe('the-db');
  const failed = await engine.handle(input('tx-2'));
  if (failed.action !== 'execute') throw new Error('expected execute');
  await failed.execution.fail(new Error('boom'));
  expect(store.commits).toBe(1);
  expect(store.rollbacks).toBe(1);
  expect(delta(before, await t.storeOperations())).toEqual({
    'acquire:ok': 2,
    'complete:ok': 1,
    'release:ok': 1,
  });
});

test('a transactional consumer (runInTransaction, as @oncely/pg-boss with a PostgresStore) reports its decisions', async () => {
  const before = await t.decisions();
  const done = new Set<string>();
  const runtime = consumerRuntime<{ id: string }>(
    () => {},
    { ...otel({ meterProvider: t.meterProvider }) },
    {
      name: '@oncely/test-broker',
      options: [],
      keyOf: (msg) => msg.id,
      fingerprint: () => '',
      runInTransaction: async (_msg, key) => {
        if (done.has(key)) return { outcome: 'replayed', result: null };
        done.add(key);
        return { outcome: 'executed', result: null };
      },
    },
  );
  await runtime.decide({ id: 'txc-1' }, 0);
  await runtime.decide({ id: 'txc-1' }, 0);
  expect(delta(before, await t.decisions())).toEqual({ 'consumer:executed': 1, 'consumer:replayed': 1 });
});

test("docs/observability.md's PromQL uses the names and labels the Prometheus exporter writes", async () => {
  const exporter = new PrometheusExporter({ preventServerStart: true });
  const meterProvider = new MeterProvider({ readers: [exporter] });
  const store = new MemoryStore();
  const engine = new Idempotency({ store, inProgress: { wait: '1s' }, ...otel({ meterProvider }) });
  const input = { method: 'POST', url: '/x', headers: { 'idempotency-key': 'prom' }, body: {}, request: {} };
  const first = await engine.handle(input);
  if (first.action !== 'execute') throw new Error('expected execute');
  const waiting = engine.handle(input);
  await sleep(30);
  // A step, for oncely_steps_total and its oncely_step_outcome label.
  await first.execution.context.step('prom-step', () => 1);
  await first.execution.complete({ status: 201, headers: {}, body: new Uint8Array() });
  await waiting;
  // A failed store operation, for its error.type label.
  class Unreachable extends Error {}
  const down = new Idempotency({
    store: Object.assign(new MemoryStore(), {
      acquire: () => Promise.reject(new Unreachable('down')),
    }),
    ...otel({ meterProvider }),
  });
  expect((await down.handle(input)).action).toBe('respond');
  // An unconfirmed write and its ending, as a RedisStore whose replicas did not confirm in time reports them.
  const hooks = otelHooks({ meterProvider, traces: false });
  hooks.onUnconfirmedWrite?.({ adapter: 'http', operation: 'complete', outcome: 'unconfirmed', key: 'prom' });
  hooks.onUnconfirmedWrite?.({ adapter: 'http', operation: 'complete', outcome: 'lost', key: 'prom' });
  const text = await new Promise<string>((resolve, reject) => {
    exporter.getMetricsRequestHandler(
      {} as never,
      {
        statusCode: 0,
        setHeader() {},
        end: (body: string) => resolve(body),
      } as never,
    );
    setTimeout(() => reject(new Error('no exposition')), 2000).unref();
  });
  const series = new Set([...text.matchAll(/^([a-z_]+)\{/gm)].map((m) => m[1]));
  const labels = new Set([...text.matchAll(/[{,]([a-z_]+)="/g)].map((m) => m[1]));
  const docs = readFileSync(join(__dirname, '../../../docs/observability.md'), 'utf8');
  const promql = [...docs.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]).join('\n');
  const used = new Set([...promql.matchAll(/\b(oncely_[a-z_]+)(?=[{[])/g)].map((m) => m[1]));
  const usedLabels = new Set(
    [...promql.matchAll(/\b((?:oncely|error)_[a-z_]+)\s*(?:=~|=|!=)/g)].map((m) => m[1]),
  );
  expect(usedLabels).toContain('error_type');
  expect(text).toMatch(/error_type="Unreachable"/);
  expect(used.size).toBeGreaterThanOrEqual(2);
  for (const name of used) expect([name, series.has(name)]).toEqual([name, true]);
  for (const label of usedLabels) expect([label, labels.has(label)]).toEqual([label, true]);
  // Every Prometheus name the metric list gives exists.
  const listedNames = [
    ...docs.matchAll(/^- `oncely\.[a-z._]+` \(`(oncely_[a-z_]+?)(?:_\{bucket,sum,count\})?`\)/gm),
  ].map((m) => m[1]);
  expect(listedNames).toHaveLength(7);
  expect(text).toMatch(/^oncely_steps_total\{oncely_step_outcome="run",oncely_adapter="http"[^}]*\} 1$/m);
  for (const name of listedNames) {
    expect([name, [...series].some((s) => s === name || s === `${name}_bucket`)]).toEqual([name, true]);
  }
  await meterProvider.shutdown();
  await store.close();
});

/** A MemoryStore with acquireInTransaction, as PostgresStore: the record commits or rolls back with the work. */
class TransactionalMemoryStore extends MemoryStore {
  commits = 0;
  rollbacks = 0;
  async acquireInTransaction(key: string, options: AcquireOptions) {
    const result = await this.acquire(key, options);
    if (result.status !== 'acquired') return result;
    const token = result.token;
    const transaction: StoreTransaction = {
      db: 'the-db',
      commit: async (response, ttlMs) => {
        this.commits++;
        return this.complete(key, token, response, ttlMs);
      },
      rollback: async () => {
        this.rollbacks++;
        await this.release(key, token);
      },
    };
    return { status: 'acquired' as const, token, transaction };
  }
}

test('wait mode: a waiter that ends conflict or store_error is counted once, with its wait timed', async () => {
  const store = new FailingWhenToldStore();
  const meter = otel({ meterProvider: t.meterProvider });
  const engine = new Idempotency({ store, scope: false, inProgress: { wait: '150ms' }, ...meter });
  const fn = idempotent(async (id: string) => id, {
    key: (id) => id,
    store,
    inProgress: { wait: '150ms' },
    ...meter,
  });
  const before = await t.decisions();
  const waitsBefore = await waitCounts();
  const input = (key: string) => ({
    method: 'POST',
    url: '/x',
    headers: { 'idempotency-key': key },
    body: {},
    request: {},
  });
  const held = await engine.handle(input('w-held'));
  expect(held.action).toBe('execute');
  // The wait runs out: conflict.
  expect((await engine.handle(input('w-held'))).action).toBe('respond');
  await expect(fn('w-held')).rejects.toThrow();
  // The store fails during the wait: store_error.
  const waiting = engine.handle(input('w-held'));
  const waitingFn = fn('w-held').catch((e: unknown) => e);
  await sleep(40);
  store.fail = true;
  expect((await waiting).action).toBe('respond');
  expect(await waitingFn).toBeInstanceOf(Error);
  store.fail = false;
  expect(delta(before, await t.decisions())).toEqual({
    'http:executed': 1,
    'http:conflict': 1,
    'http:store_error': 1,
    'consumer:conflict': 1,
    'consumer:store_error': 1,
  });
  expect(delta(waitsBefore, await waitCounts())).toEqual({
    'http:conflict': 1,
    'http:store_error': 1,
    'consumer:conflict': 1,
    'consumer:store_error': 1,
  });
  if (held.action === 'execute') await held.execution.fail();
  await store.close();
});

async function waitCounts(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const p of (await t.metrics()).get('oncely.wait.duration') ?? []) {
    out[`${p.attributes['oncely.adapter']}:${p.attributes['oncely.outcome']}`] = (
      p.value as { count: number }
    ).count;
  }
  return out;
}

class FailingWhenToldStore extends MemoryStore {
  fail = false;
  override async acquire(key: string, options: AcquireOptions) {
    if (this.fail) throw new Error('store unreachable');
    return super.acquire(key, options);
  }
}

test('an SDK that throws on every call breaks no request and no call', async () => {
  const broken = {
    getMeter() {
      throw new Error('SDK broke');
    },
  };
  const tracerProvider = {
    getTracer() {
      throw new Error('SDK broke');
    },
  };
  const logged: unknown[] = [];
  const logger = { debug() {}, info() {}, warn() {}, error: (o: object) => void logged.push(o) };
  const store = new MemoryStore();
  const app = express();
  app.use(express.json());
  app.post(
    '/x',
    idempotency({
      store,
      scope: false,
      logger,
      ...otel({ meterProvider: broken as never, tracerProvider: tracerProvider as never }),
    }),
    (_req, res) => void res.status(201).json({ ok: 1 }),
  );
  const first = await request(app).post('/x').set('Idempotency-Key', 'sdk-1').send({ a: 1 });
  const second = await request(app).post('/x').set('Idempotency-Key', 'sdk-1').send({ a: 1 });
  expect([first.status, second.status, second.headers['idempotent-replayed']]).toEqual([201, 201, 'true']);
  const fn = idempotent(async (n: number) => n * 2, {
    key: String,
    store,
    logger,
    ...otel({ meterProvider: broken as never }),
  });
  expect(await fn(21)).toBe(42);
  expect(await fn(21)).toBe(42);
  expect(logged.length).toBeGreaterThan(0);
  await store.close();
});
