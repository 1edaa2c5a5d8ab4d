import { createServer } from 'node:http';
import { Readable } from 'node:stream';
import { bodyParser } from '@koa/bodyparser';
import Router from '@koa/router';
import {
  delayOf,
  later,
  type ModelApp,
  type ModelAppFactory,
  type ModelRoute,
  modelOptions,
  nextChunk,
  type RunHandle,
  serveTestApp,
} from '@oncely/testing';
import Koa, { type Context, type Middleware } from 'koa';
import { idempotency } from '../src';
import { jsonErrors } from './harness';

/** Runs `middleware` only for paths under one of `prefixes`, as `app.use` of a mounted sub-app would. */
function under(prefixes: string[], middleware: Middleware): Middleware {
  return (ctx, next) =>
    prefixes.some((prefix) => ctx.path.startsWith(prefix)) ? middleware(ctx, next) : next();
}

/** The model app (see ModelRoute in @oncely/testing) on Koa 3 and @koa/router. */
export const koaModelApp: ModelAppFactory = async (options): Promise<ModelApp> => {
  const { recorder } = options;
  const { appWide, perUser } = modelOptions<Context>(options, (ctx) => ctx.req.headers);
  const app = new Koa();
  app.silent = true;
  app.use(jsonErrors);
  app.use(bodyParser({ enableTypes: ['json', 'text'] }));
  app.use(under(['/p/', '/n/'], idempotency(appWide)));
  const user = idempotency(perUser);
  const router = new Router();
  const begin = (route: ModelRoute, ctx: Context): RunHandle => {
    const body = ctx.request.body;
    const run = recorder.begin(
      route,
      ctx.req.headers,
      typeof body === 'string' ? body : JSON.stringify(body ?? null),
    );
    run.watch(ctx.res);
    ctx.set(run.headers());
    return run;
  };
  const json = (route: ModelRoute, status: number) => async (ctx: Context) => {
    const run = begin(route, ctx);
    await later(delayOf(ctx.req.headers));
    const body = run.json();
    run.answer(status, 'application/json', body);
    ctx.status = status;
    ctx.type = 'application/json';
    ctx.body = body;
  };
  router.post('/p/json', json('/p/json', 201));
  router.post('/p/text', async (ctx) => {
    const run = begin('/p/text', ctx);
    await later(delayOf(ctx.req.headers));
    const body = run.text();
    run.answer(201, 'text/plain', body);
    ctx.status = 201;
    ctx.type = 'text/plain';
    ctx.body = body.toString();
  });
  router.post('/n/json', user, json('/n/json', 201));
  router.post('/u/json', user, json('/u/json', 201));
  router.post('/u/fail', user, json('/u/fail', 503));
  router.post('/u/teapot', user, json('/u/teapot', 418));
  router.post('/u/throw', user, (ctx) => {
    const run = begin('/u/throw', ctx);
    run.handed();
    throw new Error('the handler threw');
  });
  router.post('/u/reject', user, async (ctx) => {
    const run = begin('/u/reject', ctx);
    await later(delayOf(ctx.req.headers));
    run.handed();
    throw new Error('the handler failed later');
  });
  router.post('/u/bad-status', user, async (ctx) => {
    const run = begin('/u/bad-status', ctx);
    await later(delayOf(ctx.req.headers));
    run.handed();
    ctx.status = 1000;
    ctx.body = { error: 'no such status' };
  });
  router.post('/u/stream', user, async (ctx) => {
    const run = begin('/u/stream', ctx);
    await later(delayOf(ctx.req.headers));
    const chunks = run.streamChunks();
    run.answer(200, 'application/octet-stream', Buffer.concat(chunks), true);
    const source = Readable.from(
      (async function* () {
        for (const chunk of chunks) {
          await nextChunk();
          yield chunk;
        }
        run.handed();
      })(),
    );
    source.on('close', () => run.handed());
    ctx.status = 200;
    ctx.type = 'application/octet-stream';
    ctx.body = source;
  });
  router.post('/u/buffer', user, async (ctx) => {
    const run = begin('/u/buffer', ctx);
    await later(delayOf(ctx.req.headers));
    const buffer = run.fill(recorder.pool.take());
    run.answer(200, 'application/octet-stream', buffer);
    ctx.res.once('close', () => recorder.pool.give(buffer));
    ctx.status = 200;
    ctx.type = 'application/octet-stream';
    ctx.body = buffer;
  });
  app.use(router.routes());
  return serveTestApp(createServer(app.callback()), () => 0);
};
