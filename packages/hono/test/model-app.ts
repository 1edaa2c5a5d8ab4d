import { createServer, type ServerResponse } from 'node:http';
import { getRequestListener } from '@hono/node-server';
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
import { type Context, Hono } from 'hono';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import { idempotency } from '../src';

type Bindings = { Bindings: { outgoing: ServerResponse } };

/** The model app (see ModelRoute in @oncely/testing) on Hono and @hono/node-server. */
export const honoModelApp: ModelAppFactory = async (options): Promise<ModelApp> => {
  const { recorder } = options;
  const { appWide, perUser } = modelOptions<Context<Bindings>>(options, (c) => c.req.raw.headers);
  const app = new Hono<Bindings>();
  const publicOne = idempotency<Bindings>(appWide);
  app.use('/p/*', publicOne);
  app.use('/n/*', publicOne);
  const user = idempotency<Bindings>(perUser);
  const begin = async (route: ModelRoute, c: Context<Bindings>): Promise<RunHandle> => {
    const run = recorder.begin(route, c.req.raw.headers, await c.req.text());
    run.watch(c.env.outgoing);
    for (const [name, value] of Object.entries(run.headers())) c.header(name, value);
    return run;
  };
  const json = (route: ModelRoute, status: number) => async (c: Context<Bindings>) => {
    const run = await begin(route, c);
    await later(delayOf(c.req.raw.headers));
    const body = run.json();
    run.answer(status, 'application/json', body);
    return c.body(new Uint8Array(body), status as ContentfulStatusCode, {
      'content-type': 'application/json',
    });
  };
  app.post('/p/json', json('/p/json', 201));
  app.post('/p/text', async (c) => {
    const run = await begin('/p/text', c);
    await later(delayOf(c.req.raw.headers));
    const body = run.text();
    run.answer(201, 'text/plain', body);
    return c.body(body.toString(), 201, { 'content-type': 'text/plain' });
  });
  app.post('/n/json', user, json('/n/json', 201));
  app.post('/u/json', user, json('/u/json', 201));
  app.post('/u/fail', user, json('/u/fail', 503));
  app.post('/u/teapot', user, json('/u/teapot', 418));
  app.post('/u/throw', user, async (c) => {
    const run = await begin('/u/throw', c);
    run.handed();
    throw new Error('the handler threw');
  });
  app.post('/u/reject', user, async (c) => {
    const run = await begin('/u/reject', c);
    await later(delayOf(c.req.raw.headers));
    run.handed();
    throw new Error('the handler failed later');
  });
  app.post('/u/bad-status', user, async (c) => {
    const run = await begin('/u/bad-status', c);
    await later(delayOf(c.req.raw.headers));
    run.handed();
    return c.json({ error: 'no such status' }, 1000 as ContentfulStatusCode);
  });
  app.post('/u/stream', user, async (c) => {
    const run = await begin('/u/stream', c);
    await later(delayOf(c.req.raw.headers));
    const chunks = run.streamChunks();
    run.answer(200, 'application/octet-stream', Buffer.concat(chunks), true);
    let i = 0;
    const stream = new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (i === chunks.length) {
          run.handed();
          return controller.close();
        }
        await nextChunk();
        controller.enqueue(new Uint8Array(chunks[i++] as Buffer));
      },
      cancel() {
        run.handed();
      },
    });
    return c.body(stream, 200, { 'content-type': 'application/octet-stream' });
  });
  app.post('/u/buffer', user, async (c) => {
    const run = await begin('/u/buffer', c);
    await later(delayOf(c.req.raw.headers));
    const buffer = run.fill(recorder.pool.take());
    run.answer(200, 'application/octet-stream', buffer);
    c.env.outgoing.once('close', () => recorder.pool.give(buffer));
    return c.body(buffer as Uint8Array<ArrayBuffer>, 200, { 'content-type': 'application/octet-stream' });
  });
  app.onError((error, c) => c.json({ error: error.message }, 500));
  return serveTestApp(createServer(getRequestListener(app.fetch)), () => 0);
};
