import { Readable } from 'node:stream';
import {
  delayOf,
  later,
  type ModelApp,
  type ModelAppFactory,
  type ModelRoute,
  modelOptions,
  nextChunk,
  type RunHandle,
} from '@oncely/testing';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { idempotencyPlugin } from '../src';

/**
 * The model app (see ModelRoute in @oncely/testing) on Fastify: the public registration in a context of `/p` and `/n`
 * routes, the per-user one registered again in a child context of it (`/n`) and in a context of its own (`/u`).
 */
export const fastifyModelApp: ModelAppFactory = async (options): Promise<ModelApp> => {
  const { recorder } = options;
  const { appWide, perUser } = modelOptions<FastifyRequest>(options, (request) => request.headers);
  const app = Fastify();
  app.setErrorHandler((error: Error & { status?: number }, _request, reply) => {
    reply.code(error.status ?? 500).send({ error: error.message });
  });
  const begin = (route: ModelRoute, request: FastifyRequest, reply: FastifyReply): RunHandle => {
    const body = request.body;
    const run = recorder.begin(
      route,
      request.headers,
      typeof body === 'string' ? body : JSON.stringify(body ?? null),
    );
    run.watch(reply.raw);
    reply.headers(run.headers());
    return run;
  };
  const json =
    (route: ModelRoute, status: number) =>
    async (request: FastifyRequest, reply: FastifyReply): Promise<Buffer> => {
      const run = begin(route, request, reply);
      await later(delayOf(request.headers));
      const body = run.json();
      run.answer(status, 'application/json', body);
      reply.code(status).type('application/json');
      return body;
    };
  const perUserRoutes = async (scope: FastifyInstance) => {
    await scope.register(idempotencyPlugin, perUser);
  };
  await app.register(async (publicScope) => {
    await publicScope.register(idempotencyPlugin, appWide);
    publicScope.post('/p/json', json('/p/json', 201));
    publicScope.post('/p/text', async (request, reply) => {
      const run = begin('/p/text', request, reply);
      await later(delayOf(request.headers));
      const body = run.text();
      run.answer(201, 'text/plain', body);
      reply.code(201).type('text/plain');
      return body.toString();
    });
    await publicScope.register(async (nested) => {
      await perUserRoutes(nested);
      nested.post('/n/json', json('/n/json', 201));
    });
  });
  await app.register(async (users) => {
    await perUserRoutes(users);
    users.post('/u/json', json('/u/json', 201));
    users.post('/u/fail', json('/u/fail', 503));
    users.post('/u/teapot', json('/u/teapot', 418));
    users.post('/u/throw', (request, reply) => {
      const run = begin('/u/throw', request, reply);
      run.handed();
      throw new Error('the handler threw');
    });
    users.post('/u/reject', async (request, reply) => {
      const run = begin('/u/reject', request, reply);
      await later(delayOf(request.headers));
      run.handed();
      throw new Error('the handler failed later');
    });
    users.post('/u/bad-status', async (request, reply) => {
      const run = begin('/u/bad-status', request, reply);
      await later(delayOf(request.headers));
      run.handed();
      reply.code(1000);
      return { error: 'no such status' };
    });
    users.post('/u/stream', async (request, reply) => {
      const run = begin('/u/stream', request, reply);
      await later(delayOf(request.headers));
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
      reply.code(200).type('application/octet-stream');
      return reply.send(source);
    });
    users.post('/u/buffer', async (request, reply) => {
      const run = begin('/u/buffer', request, reply);
      await later(delayOf(request.headers));
      const buffer = run.fill(recorder.pool.take());
      run.answer(200, 'application/octet-stream', buffer);
      reply.raw.once('close', () => recorder.pool.give(buffer));
      reply.code(200).type('application/octet-stream');
      return buffer;
    });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const address = app.server.address();
  const port = typeof address === 'object' && address !== null ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    close: async () => {
      app.server.closeAllConnections();
      await app.close();
    },
  };
};
