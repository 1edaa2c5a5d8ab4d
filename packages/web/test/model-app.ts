import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
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
import { withIdempotency } from '../src';

type Env = { incoming: IncomingMessage; outgoing: ServerResponse };
type Route = (request: Request, env: Env) => Promise<Response>;

/**
 * The model app (see ModelRoute in @oncely/testing) as fetch handlers: the public `withIdempotency` wraps the `/p`
 * and `/n` routes, the per-user one wraps each `/u` route and, inside the public one, `/n/json`.
 */
export const webModelApp: ModelAppFactory = async (options): Promise<ModelApp> => {
  const { recorder } = options;
  const { appWide, perUser } = modelOptions<Request>(options, (request) => request.headers);
  const begin = async (route: ModelRoute, request: Request, env: Env): Promise<RunHandle> => {
    const run = recorder.begin(route, request.headers, await request.text());
    run.watch(env.outgoing);
    return run;
  };
  const json =
    (route: ModelRoute, status: number): Route =>
    async (request, env) => {
      const run = await begin(route, request, env);
      await later(delayOf(request.headers));
      const body = run.json();
      run.answer(status, 'application/json', body);
      return new Response(body, {
        status,
        headers: { ...run.headers(), 'content-type': 'application/json' },
      });
    };
  const user = (route: Route) => withIdempotency(route, perUser);
  const routes: Record<ModelRoute, Route> = {
    '/p/json': json('/p/json', 201),
    '/p/text': async (request, env) => {
      const run = await begin('/p/text', request, env);
      await later(delayOf(request.headers));
      const body = run.text();
      run.answer(201, 'text/plain', body);
      return new Response(body, { status: 201, headers: { ...run.headers(), 'content-type': 'text/plain' } });
    },
    '/n/json': user(json('/n/json', 201)),
    '/u/json': user(json('/u/json', 201)),
    '/u/fail': user(json('/u/fail', 503)),
    '/u/teapot': user(json('/u/teapot', 418)),
    '/u/throw': user(async (request, env) => {
      const run = await begin('/u/throw', request, env);
      run.handed();
      throw new Error('the handler threw');
    }),
    '/u/reject': user(async (request, env) => {
      const run = await begin('/u/reject', request, env);
      await later(delayOf(request.headers));
      run.handed();
      throw new Error('the handler failed later');
    }),
    '/u/bad-status': user(async (request, env) => {
      const run = await begin('/u/bad-status', request, env);
      await later(delayOf(request.headers));
      run.handed();
      return Response.json({ error: 'no such status' }, { status: 1000, headers: run.headers() });
    }),
    '/u/stream': user(async (request, env) => {
      const run = await begin('/u/stream', request, env);
      await later(delayOf(request.headers));
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
      return new Response(stream, {
        headers: { ...run.headers(), 'content-type': 'application/octet-stream' },
      });
    }),
    '/u/buffer': user(async (request, env) => {
      const run = await begin('/u/buffer', request, env);
      await later(delayOf(request.headers));
      const buffer = run.fill(recorder.pool.take());
      run.answer(200, 'application/octet-stream', buffer);
      env.outgoing.once('close', () => recorder.pool.give(buffer));
      return new Response(buffer, {
        headers: { ...run.headers(), 'content-type': 'application/octet-stream' },
      });
    }),
  };
  const find = (request: Request) => routes[new URL(request.url).pathname as ModelRoute];
  const publicOne = withIdempotency(async (request: Request, env: Env) => {
    const route = find(request);
    return route === undefined ? new Response('not found', { status: 404 }) : route(request, env);
  }, appWide);
  // The application's error handler, outside oncely: what a thrown error becomes.
  const app = async (request: Request, env: Env): Promise<Response> => {
    try {
      const path = new URL(request.url).pathname;
      if (path.startsWith('/p/') || path.startsWith('/n/')) return await publicOne(request, env);
      const route = find(request);
      return route === undefined ? new Response('not found', { status: 404 }) : await route(request, env);
    } catch (error) {
      return Response.json({ error: (error as Error).message }, { status: 500 });
    }
  };
  // @hono/node-server passes `{ incoming, outgoing }` as the second argument; its type says any bindings.
  const listener = getRequestListener(app as unknown as Parameters<typeof getRequestListener>[0]);
  return serveTestApp(createServer(listener), () => 0);
};
