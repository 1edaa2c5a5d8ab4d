import { createServer } from 'node:http';
import { Readable } from 'node:stream';
import { bodyParser } from '@koa/bodyparser';
import Router from '@koa/router';
import {
  type AdapterHarness,
  expectedBinary,
  expectedStream,
  pipeParams,
  pipeSource,
  reusedBuffer,
  routeCounts,
  serveTestApp,
  sleep,
  stepsRoute,
  type TestApp,
  type TestAppOptions,
  viewOptions,
} from '@oncely/testing';
import Koa, { type Context, type Next } from 'koa';
import { idempotency } from '../src';

/** `expectedStream()` as a Node stream: 10 chunks of 1000 bytes, a turn of the event loop apart. */
export function streamedBody(): Readable {
  const bytes = expectedStream();
  async function* chunks(): AsyncGenerator<Buffer> {
    for (let i = 0; i < 10; i++) {
      await new Promise((resolve) => setImmediate(resolve));
      yield bytes.subarray(i * 1000, (i + 1) * 1000);
    }
  }
  return Readable.from(chunks());
}

/** The app's error handling, outermost, as Koa apps do: an error becomes `{ error }` with its status (or 500). */
export async function jsonErrors(ctx: Context, next: Next): Promise<void> {
  try {
    await next();
  } catch (error) {
    ctx.status = (error as { status?: number }).status ?? 500;
    ctx.body = { error: (error as Error).message };
  }
}

/** The suite's routes (see TestApp in @oncely/testing) on Koa 3 and @koa/router, with `app.use(idempotency())`. */
export function koaHarness(name: string): AdapterHarness {
  const harness: NestableHarness = {
    name,
    nested: { rule: 'refused', create: (outer, inner) => harness.create(outer, inner) },
    // With `inner`, POST /charges has a route-level middleware of its own too (the suite's nested registrations).
    async create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp> {
      const { hit: count, count: counted } = routeCounts();
      const app = new Koa();
      app.silent = true;
      app.use(jsonErrors);
      app.use(bodyParser());
      app.use(idempotency(viewOptions(options, (ctx: Context) => ({ headers: ctx.req.headers }))));
      const router = new Router();
      const view = (ctx: Context) => ({ headers: ctx.req.headers });
      if (inner !== undefined) router.post('/charges', idempotency(viewOptions(inner, view)));
      router.all('/charges', async (ctx) => {
        const n = count('charges');
        const delay = Number(ctx.query.delay ?? 0);
        if (delay > 0) await sleep(delay);
        ctx.set('x-charge-id', String(n));
        ctx.set('set-cookie', `session=${n}`);
        ctx.status = ctx.method === 'GET' || ctx.method === 'DELETE' ? 200 : 201;
        ctx.body = { id: n, amount: (ctx.request.body as { amount?: number } | undefined)?.amount ?? null };
      });
      router.post('/status/:code', async (ctx) => {
        const n = count('status');
        const code = Number(ctx.params.code);
        const delay = Number(ctx.query.delay ?? 0);
        if (delay > 0) await sleep(delay);
        ctx.status = code;
        if (code !== 204) ctx.body = { n };
      });
      router.post('/throw', (ctx) => {
        count('throw');
        const status = ctx.query.status;
        throw Object.assign(new Error('boom'), status ? { status: Number(status) } : {});
      });
      router.post('/reject', async () => {
        count('reject');
        await new Promise((resolve) => setImmediate(resolve));
        throw new Error('async boom');
      });
      router.post('/binary', (ctx) => {
        count('binary');
        ctx.type = 'application/octet-stream';
        ctx.body = expectedBinary();
      });
      router.post('/stream', (ctx) => {
        count('stream');
        ctx.type = 'application/octet-stream';
        ctx.body = streamedBody();
      });
      router.post('/big', (ctx) => {
        count('big');
        ctx.type = 'text/plain';
        ctx.body = 'x'.repeat(Number(ctx.query.size));
      });
      router.post('/text', (ctx) => {
        count('text');
        ctx.type = 'text/plain';
        ctx.body = 'héllo wörld ✓';
      });
      router.post('/key', (ctx) => {
        ctx.body = { key: ctx.state.idempotencyKey ?? null };
      });
      router.post(
        '/bad-status',
        // A hand-written error handler that trusts every error to carry a status (Koa's ctx.status refuses it).
        async (ctx, next) => {
          try {
            await next();
          } catch (error) {
            ctx.status = (error as { status?: number }).status as number;
            ctx.body = { error: (error as Error).message };
          }
        },
        (ctx) => {
          count('bad-status');
          if (ctx.query.in === 'handler') ctx.status = undefined as unknown as number;
          else throw new Error('no status');
        },
      );
      router.post('/pipe', (ctx) => {
        count('pipe');
        const { chunks, every, fail } = pipeParams(ctx.query);
        ctx.type = 'application/octet-stream';
        ctx.body = pipeSource(chunks, every, fail);
      });
      router.post('/reused', (ctx) => {
        count('reused');
        ctx.type = 'application/octet-stream';
        ctx.body = reusedBuffer();
      });
      router.post('/steps', async (ctx) => {
        const answer = await stepsRoute(ctx.state.idempotency, ctx.query, count);
        ctx.status = answer.status;
        ctx.body = answer.body;
      });
      app.use(router.routes());
      return serveTestApp(createServer(app.callback()), counted);
    },
  };
  return harness;
}

/** A harness whose `create` also takes the options of a route-level registration on POST /charges. */
type NestableHarness = AdapterHarness & {
  create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp>;
};
