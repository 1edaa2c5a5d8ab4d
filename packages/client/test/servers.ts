import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyStore } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { idempotencyPlugin } from '@oncely/fastify';
import { routeCounts } from '@oncely/testing';
import express, { type Request, type Response } from 'express';
import Fastify from 'fastify';

/**
 * An oncely server for the client's tests, listening on a free port of 127.0.0.1. Routes (each counts its runs):
 * - `POST /charges?delay=ms`: 201 `{ id: n, amount, key }` after `delay`, with `x-charge-id: n`.
 * - `POST /flaky?times=N&retryAfter=V`: the first N runs answer 503 (not stored, so the key is released) with
 *   `Retry-After: V` (`date+S`: an HTTP date S seconds ahead); later runs 201 `{ n }`.
 * - `POST /echo?times=N`: keeps the body's bytes in `bodies`; the first N runs answer 503, later ones 201 with the
 *   bytes back.
 * - `GET /items?times=N`: the first N runs answer 503, later ones 200 `{ n }`.
 * - `POST /taken`: the handler's own 409 `{ n, error: 'taken' }` (stored by oncely, as any answer under 500).
 */
export interface TestServer {
  url: string;
  count(route: string): number;
  /** The request bodies `/echo` received, one per run. */
  bodies: Buffer[];
  close(): Promise<void>;
}

export interface ServerKind {
  name: string;
  start(store: IdempotencyStore): Promise<TestServer>;
}

interface Route {
  hit: (route: string) => number;
  bodies: Buffer[];
  /** Waits `ms`; `flush` ends every wait at once, so that closing never waits on a slow handler. */
  wait: (ms: number) => Promise<void>;
  flush: () => void;
}

/** Timed waits that `flush` ends at once, so that closing a server never waits on a slow handler. */
export function flushableWaits(): Pick<Route, 'wait' | 'flush'> {
  const pending = new Set<() => void>();
  return {
    wait: (ms) =>
      new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          pending.delete(done);
          resolve();
        };
        const timer = setTimeout(done, ms);
        pending.add(done);
      }),
    flush: () => {
      for (const done of [...pending]) done();
    },
  };
}

function routeState(): Route & { count: (route: string) => number } {
  const { hit, count } = routeCounts();
  return { hit, count, bodies: [], ...flushableWaits() };
}

const times = (query: unknown) => Number((query as { times?: string }).times ?? 0);

function retryAfterValue(value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  const ahead = /^date\+(\d+)$/.exec(value);
  return ahead ? new Date(Date.now() + Number(ahead[1]) * 1000).toUTCString() : value;
}

export const expressServer: ServerKind = {
  name: 'Express',
  async start(store) {
    const state = routeState();
    const app = express();
    app.use(express.json());
    app.use(express.raw({ type: 'application/octet-stream', limit: '10mb' }));
    app.use(idempotency({ store }));
    app.post('/charges', async (req: Request, res: Response) => {
      const n = state.hit('charges');
      await state.wait(Number(req.query.delay ?? 0));
      res.setHeader('x-charge-id', String(n));
      res.status(201).json({ id: n, amount: req.body?.amount ?? null, key: req.idempotencyKey ?? null });
    });
    app.post('/flaky', (req: Request, res: Response) => {
      const n = state.hit('flaky');
      if (n > times(req.query)) return void res.status(201).json({ n });
      const retryAfter = retryAfterValue(req.query.retryAfter as string | undefined);
      if (retryAfter !== undefined) res.setHeader('retry-after', retryAfter);
      res.status(503).json({ n });
    });
    app.post('/echo', (req: Request, res: Response) => {
      const n = state.hit('echo');
      state.bodies.push(Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0));
      if (n <= times(req.query)) return void res.status(503).json({ n });
      res.status(201).type('application/octet-stream').send(req.body);
    });
    app.post('/taken', (_req: Request, res: Response) => {
      res.status(409).json({ n: state.hit('taken'), error: 'taken' });
    });
    app.get('/items', (req: Request, res: Response) => {
      const n = state.hit('items');
      res.status(n <= times(req.query) ? 503 : 200).json({ n, key: req.header('idempotency-key') ?? null });
    });
    const server = createServer(app);
    server.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const { port } = server.address() as AddressInfo;
    return {
      url: `http://127.0.0.1:${port}`,
      count: state.count,
      bodies: state.bodies,
      close: () =>
        new Promise<void>((resolve) => {
          state.flush();
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    };
  },
};

export const fastifyServer: ServerKind = {
  name: 'Fastify',
  async start(store) {
    const state = routeState();
    const app = Fastify();
    app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer' }, (_req, body, done) =>
      done(null, body),
    );
    await app.register(idempotencyPlugin, { store });
    app.post('/charges', async (request, reply) => {
      const n = state.hit('charges');
      await state.wait(Number((request.query as { delay?: string }).delay ?? 0));
      reply.header('x-charge-id', String(n)).code(201);
      const amount = (request.body as { amount?: number } | undefined)?.amount ?? null;
      return { id: n, amount, key: request.idempotencyKey ?? null };
    });
    app.post('/flaky', async (request, reply) => {
      const n = state.hit('flaky');
      if (n > times(request.query)) return reply.code(201).send({ n });
      const retryAfter = retryAfterValue((request.query as { retryAfter?: string }).retryAfter);
      if (retryAfter !== undefined) reply.header('retry-after', retryAfter);
      return reply.code(503).send({ n });
    });
    app.post('/echo', async (request, reply) => {
      const n = state.hit('echo');
      const body = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
      state.bodies.push(body);
      if (n <= times(request.query)) return reply.code(503).send({ n });
      return reply.code(201).type('application/octet-stream').send(body);
    });
    app.post('/taken', async (_request, reply) =>
      reply.code(409).send({ n: state.hit('taken'), error: 'taken' }),
    );
    app.get('/items', async (request, reply) => {
      const n = state.hit('items');
      const key = request.headers['idempotency-key'] ?? null;
      return reply.code(n <= times(request.query) ? 503 : 200).send({ n, key });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = app.server.address() as AddressInfo;
    return {
      url: `http://127.0.0.1:${port}`,
      count: state.count,
      bodies: state.bodies,
      close: async () => {
        state.flush();
        app.server.closeAllConnections();
        await app.close();
      },
    };
  },
};
