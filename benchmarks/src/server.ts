// One benchmark server in a process of its own: the kind comes from BENCH_CONFIG (see config.ts). It listens on
// 127.0.0.1, port 0, and prints {"port": n} on stdout. SIGTERM closes it and exits 0 (so --cpu-prof can write).

import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readConfig, type ServerConfig, type ServerKind, type Services } from './config';
import { openFloor } from './floor';
import { otelOptions } from './otel';
import { type ChargeRequest, charge, PATH } from './route';
import { type OpenStore, openStore } from './stores';

const { kind, services } = readConfig<ServerConfig>();

let closeAll: () => Promise<void> = async () => {};

// The floor's answers: the same JSON content type as the frameworks' own, and a replay marked as oncely marks it.
const JSON_HEADERS = { 'content-type': 'application/json; charset=utf-8' };
const REPLAYED = { 'idempotent-replayed': 'true' };

async function startExpress(kind: ServerKind & { framework?: string }, services: Services): Promise<Server> {
  const { default: express } = await import('express');
  const app = express();
  app.disable('x-powered-by');
  app.use(express.json());
  let opened: OpenStore | undefined;
  if (kind.impl === 'oncely') {
    const { idempotency } = await import('@oncely/express');
    opened = await openStore(kind.store, services);
    app.use(idempotency({ store: opened.store }));
    app.post(PATH, (req, res) => {
      res.status(201).json(charge(req.body as ChargeRequest));
    });
  } else if (kind.impl === 'express-idempotency') {
    // As its README says: the middleware, then `isHit(req)` in the handler (it calls next() after a replay too).
    const { idempotency, getSharedIdempotencyService } = await import('express-idempotency');
    let dataAdapter: unknown;
    if (kind.store === 'redis') {
      // As express-idempotency-redis-adapter's README says (node-redis v4 client made by the adapter).
      type Adapter = { connect(): Promise<void>; disconnect(): Promise<void> };
      type AdapterClass = new (options: object) => Adapter;
      // A CommonJS module whose class is `exports.default`: Node's interop nests it one level deeper than tsx's.
      const mod = (await import('express-idempotency-redis-adapter')) as unknown as {
        default: AdapterClass | { default: AdapterClass };
      };
      const RedisAdapter = typeof mod.default === 'function' ? mod.default : mod.default.default;
      const adapter = new RedisAdapter({ connectionConfig: { url: services.redisUrl } });
      await adapter.connect();
      dataAdapter = adapter;
      const previous = closeAll;
      closeAll = async () => {
        await previous();
        await adapter.disconnect();
      };
    }
    app.use(idempotency(dataAdapter === undefined ? {} : { dataAdapter: dataAdapter as never }));
    app.post(PATH, (req, res) => {
      if (getSharedIdempotencyService().isHit(req)) return;
      res.status(201).json(charge(req.body as ChargeRequest));
    });
  } else if (kind.impl === 'floor') {
    const floor = await openFloor(services.redisUrl, `${services.redisPrefix}floor:`);
    closeAll = () => floor.close();
    app.post(PATH, async (req, res) => {
      const key = req.get('idempotency-key');
      const answer = key === undefined ? undefined : await floor.reserve(key);
      if (answer === 'in-progress') {
        res.status(409).end();
      } else if (answer !== undefined) {
        res.status(answer.status).set(answer.headers).set(REPLAYED).send(answer.body);
      } else {
        const body = Buffer.from(JSON.stringify(charge(req.body as ChargeRequest)));
        if (key !== undefined) await floor.store(key, { status: 201, headers: JSON_HEADERS, body });
        res.status(201).set(JSON_HEADERS).send(body);
      }
    });
  } else {
    app.post(PATH, (req, res) => {
      res.status(201).json(charge(req.body as ChargeRequest));
    });
  }
  if (opened !== undefined) {
    const store = opened;
    const previous = closeAll;
    closeAll = async () => {
      await previous();
      await store.close();
    };
  }
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => resolve(server));
  });
}

async function startFastify(kind: ServerKind, services: Services): Promise<Server> {
  const { default: Fastify } = await import('fastify');
  const fastify = Fastify({ logger: false });
  if (kind.impl === 'oncely') {
    const { idempotencyPlugin } = await import('@oncely/fastify');
    const opened = await openStore(kind.store, services);
    await fastify.register(idempotencyPlugin, {
      store: opened.store,
      ...(kind.otel === true ? await otelOptions() : {}),
    });
    closeAll = () => opened.close();
  }
  if (kind.impl === 'floor') {
    const floor = await openFloor(services.redisUrl, `${services.redisPrefix}floor:`);
    closeAll = () => floor.close();
    fastify.post(PATH, async (request, reply) => {
      const key = request.headers['idempotency-key'] as string | undefined;
      const answer = key === undefined ? undefined : await floor.reserve(key);
      if (answer === 'in-progress') return reply.code(409).send();
      if (answer !== undefined)
        return reply.code(answer.status).headers(answer.headers).headers(REPLAYED).send(answer.body);
      const body = Buffer.from(JSON.stringify(charge(request.body as ChargeRequest)));
      if (key !== undefined) await floor.store(key, { status: 201, headers: JSON_HEADERS, body });
      return reply.code(201).headers(JSON_HEADERS).send(body);
    });
  } else {
    fastify.post(PATH, async (request, reply) => {
      reply.code(201);
      return charge(request.body as ChargeRequest);
    });
  }
  await fastify.listen({ port: 0, host: '127.0.0.1' });
  return fastify.server;
}

async function startHono(kind: ServerKind, services: Services): Promise<Server> {
  const { Hono } = await import('hono');
  const { createServer } = await import('node:http');
  const { getRequestListener } = await import('@hono/node-server');
  const app = new Hono();
  if (kind.impl === 'oncely') {
    const { idempotency } = await import('@oncely/hono');
    const opened = await openStore(kind.store, services);
    app.use(idempotency({ store: opened.store }));
    closeAll = () => opened.close();
  }
  app.post(PATH, async (c) => c.json(charge(await c.req.json<ChargeRequest>()), 201));
  const server = createServer(getRequestListener(app.fetch));
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

async function startKoa(kind: ServerKind, services: Services): Promise<Server> {
  const { default: Koa } = await import('koa');
  const { bodyParser } = await import('@koa/bodyparser');
  const app = new Koa();
  app.use(bodyParser());
  if (kind.impl === 'oncely') {
    const { idempotency } = await import('@oncely/koa');
    const opened = await openStore(kind.store, services);
    app.use(idempotency({ store: opened.store }));
    closeAll = () => opened.close();
  }
  app.use((ctx) => {
    if (ctx.method !== 'POST' || ctx.path !== PATH) return;
    ctx.status = 201;
    ctx.body = charge(ctx.request.body as ChargeRequest);
  });
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => resolve(server));
  });
}

async function start(): Promise<Server> {
  if (kind.impl === 'nest' || (kind.impl !== 'express-idempotency' && kind.framework === 'nest')) {
    const { startNest } = await import('./nest-app');
    const { server, close } = await startNest(kind, services);
    closeAll = close;
    return server;
  }
  if (kind.impl === 'express-idempotency') return startExpress(kind, services);
  if (kind.framework === 'hono') return startHono(kind, services);
  if (kind.framework === 'koa') return startKoa(kind, services);
  return kind.framework === 'fastify' ? startFastify(kind, services) : startExpress(kind, services);
}

const server = await start();
process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);

let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  server.closeAllConnections?.();
  server.close();
  void closeAll()
    .catch(() => {})
    .finally(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
