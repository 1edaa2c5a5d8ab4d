import { Readable } from 'node:stream';
import {
  type AdapterHarness,
  pipeParams,
  pipeSource,
  reusedBuffer,
  routeCounts,
  stepsRoute,
  type TestApp,
  type TestAppOptions,
} from '@oncely/testing';
import Fastify, { type RouteOptions } from 'fastify';
import { idempotencyPlugin } from '../src';

function streamBytes(): Buffer {
  const body = Buffer.alloc(10_000);
  for (let i = 0; i < body.length; i++) body[i] = (i * 7) % 256;
  return body;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The suite's routes (see TestApp in @oncely/testing), on Fastify. */
export const fastifyHarness: AdapterHarness & {
  create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp>;
} = {
  name: 'Fastify 5',
  nested: { rule: 'nearest', create: (outer, inner) => fastifyHarness.create(outer, inner) },
  // With `inner`, POST /charges is declared in a child context that registers the plugin again with it.
  async create(options: TestAppOptions, inner?: TestAppOptions): Promise<TestApp> {
    const { hit: count, count: counted } = routeCounts();
    const app = Fastify();
    await app.register(idempotencyPlugin, options);
    app.setErrorHandler((error: Error & { status?: number }, _request, reply) => {
      reply.code(error.status ?? 500).send({ error: error.message });
    });
    const charges: RouteOptions = {
      method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'],
      url: '/charges',
      handler: async (request, reply) => {
        const n = count('charges');
        const delay = Number((request.query as { delay?: string }).delay ?? 0);
        if (delay > 0) await sleep(delay);
        reply.header('x-charge-id', String(n));
        reply.header('set-cookie', `session=${n}`);
        reply.code(request.method === 'GET' || request.method === 'DELETE' ? 200 : 201);
        return { id: n, amount: (request.body as { amount?: number } | undefined)?.amount ?? null };
      },
    };
    if (inner === undefined) app.route(charges);
    else {
      app.route({ ...charges, method: ['GET', 'PUT', 'PATCH', 'DELETE'] });
      await app.register(async (child) => {
        await child.register(idempotencyPlugin, inner);
        child.route({ ...charges, method: 'POST' });
      });
    }
    app.post('/status/:code', async (request, reply) => {
      const n = count('status');
      const delay = Number((request.query as { delay?: string }).delay ?? 0);
      if (delay > 0) await sleep(delay);
      const code = Number((request.params as { code: string }).code);
      reply.code(code);
      return code === 204 ? reply.send() : { n };
    });
    app.post('/throw', (request) => {
      count('throw');
      const status = (request.query as { status?: string }).status;
      throw Object.assign(new Error('boom'), status ? { status: Number(status) } : {});
    });
    app.post('/reject', async () => {
      count('reject');
      await sleep(1);
      throw new Error('async boom');
    });
    app.post('/binary', async (_request, reply) => {
      count('binary');
      const body = Buffer.alloc(1024);
      for (let i = 0; i < body.length; i++) body[i] = i % 256;
      reply.type('application/octet-stream');
      return body;
    });
    app.post('/stream', async (_request, reply) => {
      count('stream');
      const body = streamBytes();
      const chunks = Array.from({ length: 10 }, (_, i) => body.subarray(i * 1000, (i + 1) * 1000));
      reply.type('application/octet-stream');
      return reply.send(
        Readable.from(
          (async function* () {
            for (const chunk of chunks) {
              await new Promise((resolve) => setImmediate(resolve));
              yield chunk;
            }
          })(),
        ),
      );
    });
    app.post('/big', async (request, reply) => {
      count('big');
      reply.type('text/plain');
      return 'x'.repeat(Number((request.query as { size: string }).size));
    });
    app.post('/text', async (_request, reply) => {
      count('text');
      reply.type('text/plain; charset=utf-8');
      return 'héllo wörld ✓';
    });
    app.post('/key', async (request) => ({ key: request.idempotencyKey ?? null }));
    app.post('/bad-status', {
      handler: async (request, reply) => {
        count('bad-status');
        // Fastify's reply.code() refuses it (throws), as Node would.
        if ((request.query as { in?: string }).in === 'handler')
          return reply.code(undefined as unknown as number).send({});
        throw new Error('no status');
      },
      // A hand-written error handler that trusts every error to carry a status.
      errorHandler: (error: Error & { status?: number }, _request, reply) => {
        reply.code(error.status as number).send({ error: error.message });
      },
    });
    app.post('/pipe', async (request, reply) => {
      count('pipe');
      const { chunks, every, fail } = pipeParams(request.query as Record<string, unknown>);
      reply.type('application/octet-stream');
      return reply.send(pipeSource(chunks, every, fail));
    });
    app.post('/reused', async (_request, reply) => {
      count('reused');
      reply.type('application/octet-stream');
      return reply.send(reusedBuffer());
    });
    app.post('/steps', async (request, reply) => {
      const answer = await stepsRoute(request.idempotency, request.query as Record<string, unknown>, count);
      return reply.code(answer.status).send(answer.body);
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const address = app.server.address();
    const port = typeof address === 'object' && address !== null ? address.port : 0;
    return {
      url: `http://127.0.0.1:${port}`,
      count: counted,
      close: async () => {
        app.server.closeAllConnections();
        await app.close();
      },
    };
  },
};
