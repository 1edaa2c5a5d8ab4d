import { createServer } from 'node:http';
import { getRequestListener } from '@hono/node-server';
import {
  type AdapterHarness,
  expectedBinary,
  expectedWebStream,
  pipeParams,
  pipeWebSource,
  reusedBuffer,
  routeCounts,
  serveTestApp,
  stepsRoute,
  type TestApp,
  type TestAppOptions,
  viewOptions,
} from '@oncely/testing';
import { type Context, Hono } from 'hono';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import { idempotency } from '../src';

const later = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The suite's routes (see TestApp in @oncely/testing) on a Hono app with `app.use(idempotency())`. */
export function honoHarness(name: string): AdapterHarness {
  const harness: NestableHarness = {
    name,
    nested: { rule: 'nearest', create: (outer, inner) => harness.create(outer, inner) },
    // With `inner`, POST /charges has a route-level middleware of its own too (the suite's nested registrations).
    async create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp> {
      const { hit: count, count: counted } = routeCounts();
      const app = new Hono();
      app.use(
        idempotency(
          viewOptions(options, (c: Context) => ({ headers: Object.fromEntries(c.req.raw.headers) })),
        ),
      );
      if (inner !== undefined) {
        const view = (c: Context) => ({ headers: Object.fromEntries(c.req.raw.headers) });
        app.post('/charges', idempotency(viewOptions(inner, view)));
      }
      app.on(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'], '/charges', async (c) => {
        const n = count('charges');
        const text = await c.req.text();
        const body = text === '' ? {} : (JSON.parse(text) as { amount?: number });
        const delay = Number(c.req.query('delay') ?? 0);
        if (delay > 0) await later(delay);
        c.header('x-charge-id', String(n));
        c.header('set-cookie', `session=${n}`);
        return c.json(
          { id: n, amount: body.amount ?? null },
          c.req.method === 'GET' || c.req.method === 'DELETE' ? 200 : 201,
        );
      });
      app.post('/status/:code', async (c) => {
        const n = count('status');
        const code = Number(c.req.param('code'));
        const delay = Number(c.req.query('delay') ?? 0);
        if (delay > 0) await later(delay);
        return code === 204 ? c.body(null, 204) : c.json({ n }, code as ContentfulStatusCode);
      });
      app.post('/throw', (c) => {
        count('throw');
        const status = c.req.query('status');
        throw Object.assign(new Error('boom'), status ? { status: Number(status) } : {});
      });
      app.post('/reject', async () => {
        count('reject');
        await new Promise((resolve) => setImmediate(resolve));
        throw new Error('async boom');
      });
      app.post('/binary', (c) => {
        count('binary');
        return c.body(new Uint8Array(expectedBinary()), 200, { 'content-type': 'application/octet-stream' });
      });
      app.post('/stream', (c) => {
        count('stream');
        return c.body(expectedWebStream(), 200, { 'content-type': 'application/octet-stream' });
      });
      app.post('/big', (c) => {
        count('big');
        return c.text('x'.repeat(Number(c.req.query('size'))));
      });
      app.post('/text', (c) => {
        count('text');
        return c.text('héllo wörld ✓');
      });
      app.post('/key', (c) => c.json({ key: c.get('idempotencyKey') ?? null }));
      app.post('/bad-status', (c) => {
        count('bad-status');
        // Undici's Response refuses a status outside 200-599 (a RangeError); @hono/node-server's takes it, and
        // Node would refuse it when writing the head.
        if (c.req.query('in') === 'handler') return c.json({}, 1000 as ContentfulStatusCode);
        throw new Error('no status');
      });
      app.post('/pipe', (c) => {
        count('pipe');
        const { chunks, every, fail } = pipeParams(new URL(c.req.url).searchParams);
        return c.body(pipeWebSource(chunks, every, fail), 200, {
          'content-type': 'application/octet-stream',
        });
      });
      app.post('/reused', (c) => {
        count('reused');
        return c.body(reusedBuffer(), 200, { 'content-type': 'application/octet-stream' });
      });
      app.post('/steps', async (c) => {
        const answer = await stepsRoute(c.get('idempotency'), c.req.query(), count);
        return c.json(answer.body, answer.status as ContentfulStatusCode);
      });
      app.onError((error, c) => {
        // /bad-status: a hand-written error handler that answers a status no HTTP response can have.
        if (c.req.path === '/bad-status')
          return c.json({ error: error.message }, ((error as { status?: number }).status ?? 1000) as never);
        const status = (error as Error & { status?: number }).status ?? 500;
        return c.json({ error: error.message }, status as ContentfulStatusCode);
      });

      const server = createServer(getRequestListener(app.fetch));
      return serveTestApp(server, counted);
    },
  };
  return harness;
}

/** A harness whose `create` also takes the options of a route-level registration on POST /charges. */
type NestableHarness = AdapterHarness & {
  create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp>;
};
