import { Writable } from 'node:stream';
import { IdempotencyOptionsError, MemoryStore } from '@oncely/core';
import { brokenStore } from '@oncely/testing';
import Fastify, { type FastifyInstance } from 'fastify';
import idempotencyPluginDefault, { idempotencyPlugin, scopeByHeader } from '../src';

const post = (app: FastifyInstance, url: string, key?: string, payload: object = {}) =>
  app.inject({ method: 'POST', url, payload, headers: key === undefined ? {} : { 'idempotency-key': key } });

describe('@oncely/fastify specifics', () => {
  test('per-route config: an object overrides, false opts out, the rest use the plugin options', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin);
    let runs = 0;
    app.post('/required', { config: { idempotency: { required: true } } }, async () => ({ run: ++runs }));
    app.post('/off', { config: { idempotency: false } }, async () => ({ run: ++runs }));
    app.post('/default', async () => ({ run: ++runs }));
    expect((await post(app, '/required')).statusCode).toBe(400);
    expect((await post(app, '/default')).statusCode).toBe(200);
    await post(app, '/off', 'k');
    await post(app, '/off', 'k');
    expect(runs).toBe(3);
    await post(app, '/default', 'k');
    const replay = await post(app, '/default', 'k');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(4);
    await app.close();
  });

  test('credentials without a scope: a route with scope: false stays quiet, the plugin warns once for the rest', async () => {
    const warnings: unknown[] = [];
    const app = Fastify();
    await app.register(idempotencyPlugin, {
      hooks: { onUnscopedCredentials: (event) => void warnings.push(event) },
    });
    app.post('/public', { config: { idempotency: { scope: false } } }, async () => ({ ok: true }));
    app.post('/a', async () => ({ ok: true }));
    app.post('/b', async () => ({ ok: true }));
    const send = (url: string, key: string) =>
      app.inject({ method: 'POST', url, payload: {}, headers: { 'idempotency-key': key, cookie: 's=1' } });
    await send('/public', 'p');
    expect(warnings).toEqual([]);
    await send('/a', 'a');
    await send('/b', 'b');
    expect(warnings).toEqual([{ header: 'cookie' }]);
    await app.close();
  });

  test('scopeByHeader, exported by @oncely/fastify, types as a Fastify scope and isolates API keys', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, {
      scope: scopeByHeader('x-api-key', { secret: 'fastify-test-secret-0123456789' }),
    });
    let runs = 0;
    app.post('/charges', async () => ({ run: ++runs }));
    const send = (apiKey: string) =>
      app.inject({
        method: 'POST',
        url: '/charges',
        payload: {},
        headers: { 'idempotency-key': 'same', 'x-api-key': apiKey },
      });
    await send('k1');
    await send('k2');
    expect((await send('k1')).headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(2);
    await app.close();
  });

  test('headers set before oncely ran (an onRequest hook: CORS, a request id) are fresh on a replay', async () => {
    const app = Fastify();
    let requests = 0;
    app.addHook('onRequest', async (request, reply) => {
      reply.header('x-request-id', `req-${++requests}`);
      reply.header('access-control-allow-origin', String(request.headers.origin));
    });
    await app.register(idempotencyPlugin);
    app.post('/charges', async (_request, reply) => {
      reply.header('x-charge', 'ch_1');
      reply.code(201);
      return { ok: true };
    });
    const send = (origin: string) =>
      app.inject({
        method: 'POST',
        url: '/charges',
        headers: { origin, 'idempotency-key': 'cors' },
        payload: {},
      });
    const first = await send('https://a.example');
    const replay = await send('https://b.example');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['x-request-id']).toBe('req-1');
    expect(replay.headers['x-request-id']).toBe('req-2');
    expect(replay.headers['access-control-allow-origin']).toBe('https://b.example');
    expect(replay.headers['x-charge']).toBe('ch_1');
    await app.close();
  });

  test('global: false covers only routes whose config.idempotency is set', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, { global: false });
    let runs = 0;
    app.post('/on', { config: { idempotency: true } }, async () => ({ run: ++runs }));
    app.post('/plain', async () => ({ run: ++runs }));
    await post(app, '/on', 'k');
    expect((await post(app, '/on', 'k')).headers['idempotent-replayed']).toBe('true');
    await post(app, '/plain', 'k');
    await post(app, '/plain', 'k');
    expect(runs).toBe(3);
    await app.close();
  });

  test('a route config can cover a method the plugin does not', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin);
    let runs = 0;
    app.delete('/items/:id', { config: { idempotency: { methods: ['DELETE'] } } }, async () => ({
      run: ++runs,
    }));
    await app.inject({ method: 'DELETE', url: '/items/1', headers: { 'idempotency-key': 'd' } });
    const replay = await app.inject({
      method: 'DELETE',
      url: '/items/1',
      headers: { 'idempotency-key': 'd' },
    });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
    await app.close();
  });

  test('schema validation failures happen before oncely and are not stored', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin);
    let runs = 0;
    app.post(
      '/validated',
      {
        schema: {
          body: { type: 'object', required: ['amount'], properties: { amount: { type: 'number' } } },
        },
      },
      async () => ({ run: ++runs }),
    );
    expect((await post(app, '/validated', 'v', {})).statusCode).toBe(400);
    const fixed = await post(app, '/validated', 'v', { amount: 1 });
    expect(fixed.statusCode).toBe(200);
    expect(fixed.headers['idempotent-replayed']).toBeUndefined();
    expect(runs).toBe(1);
    await app.close();
  });

  test('logs through request.log when no logger is given', async () => {
    const lines: string[] = [];
    const stream = new Writable({
      write(chunk, _encoding, done) {
        lines.push(String(chunk));
        done();
      },
    });
    const app = Fastify({ logger: { level: 'warn', stream } });
    await app.register(idempotencyPlugin, { store: brokenStore() });
    app.post('/charges', async () => ({ ok: true }));
    const res = await post(app, '/charges', 'k');
    expect(res.statusCode).toBe(503);
    const line = lines
      .map((l) => JSON.parse(l) as { msg: string; reqId?: string })
      .find((l) => /store unavailable/.test(l.msg));
    expect(line).toBeDefined();
    expect(line?.reqId).toBeDefined(); // a child logger of the request, not the root one
    await app.close();
  });

  test('bad plugin or route options fail at registration, naming the option', async () => {
    const app = Fastify();
    await expect(app.register(idempotencyPlugin, { ttl: 'never' as never })).rejects.toThrow(/option "ttl"/);
    const app2 = Fastify();
    await app2.register(idempotencyPlugin);
    expect(() =>
      app2.post('/x', { config: { idempotency: { inProgressStatus: 418 as 409 } } }, async () => ({})),
    ).toThrow(IdempotencyOptionsError);
  });

  test('a misspelt route option, which compiles inline, throws when the route is added', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin);
    expect(() =>
      app.post('/x', { config: { idempotency: { ttll: '1h', requried: true } } }, async () => ({})),
    ).toThrow(IdempotencyOptionsError);
    expect(() => app.post('/y', { config: { idempotency: { ttl: '1h' } } }, async () => ({}))).not.toThrow();
  });

  test('the default export is the plugin, wrapped with fastify-plugin', () => {
    expect(idempotencyPluginDefault).toBe(idempotencyPlugin);
    const meta = (idempotencyPlugin as unknown as Record<symbol, { name: string }>)[
      Symbol.for('plugin-meta')
    ];
    expect(meta?.name).toBe('@oncely/fastify');
  });

  test('registered again in a child context: its options are over the root one’s for its routes, route config over both', async () => {
    const store = new MemoryStore();
    const app = Fastify();
    await app.register(idempotencyPlugin, { store, scope: false });
    let runs = 0;
    app.post('/public', async () => ({ run: ++runs }));
    await app.register(async (child) => {
      // No store given: the root registration's store, with this scope.
      await child.register(idempotencyPlugin, { scope: (request) => String(request.headers['x-user']) });
      child.post('/mine', { config: { idempotency: { required: true } } }, async (request) => ({
        user: request.headers['x-user'],
        run: ++runs,
      }));
      child.post('/loose', async (request) => ({ user: request.headers['x-user'], run: ++runs }));
    });
    const as = (url: string, user: string, key?: string) =>
      app.inject({
        method: 'POST',
        url,
        payload: {},
        headers: { 'x-user': user, ...(key === undefined ? {} : { 'idempotency-key': key }) },
      });
    const alice = await as('/mine', 'alice', 'k');
    const bob = await as('/mine', 'bob', 'k');
    expect(alice.json()).toEqual({ user: 'alice', run: 1 });
    expect(bob.headers['idempotent-replayed']).toBeUndefined();
    expect(bob.json()).toEqual({ user: 'bob', run: 2 });
    expect((await as('/mine', 'alice', 'k')).headers['idempotent-replayed']).toBe('true');
    // The route's config is over the child registration's options; the child's sibling route keeps its own.
    expect((await as('/mine', 'alice')).statusCode).toBe(400);
    expect((await as('/loose', 'alice')).statusCode).toBe(200);
    // The root's routes keep the root's options: one key space, as configured.
    expect((await as('/public', 'alice', 'p')).json()).toEqual({ run: 4 });
    const publicReplay = await as('/public', 'bob', 'p');
    expect(publicReplay.headers['idempotent-replayed']).toBe('true');
    // Every record in the root's store: 2 on /mine, 1 on /public.
    expect(store.size).toBe(3);
    await app.close();
  });

  test.each([
    ['global: false', { global: false }],
    ["methods: ['PUT']", { methods: ['PUT'] }],
  ])(
    'a child registration with %s leaves the routes and methods it does not cover to the root one',
    async (_name, narrower) => {
      const app = Fastify();
      await app.register(idempotencyPlugin, { scope: false, required: true });
      let runs = 0;
      await app.register(async (child) => {
        await child.register(idempotencyPlugin, {
          ...narrower,
          scope: (request) => `user:${String(request.headers['x-user'])}`,
        });
        child.route({
          method: ['POST', 'PUT'],
          url: '/b',
          handler: async (request) => ({ user: request.headers['x-user'], run: ++runs }),
        });
      });
      const as = (method: 'POST' | 'PUT', user: string, key?: string) =>
        app.inject({
          method,
          url: '/b',
          payload: {},
          headers: { 'x-user': user, ...(key === undefined ? {} : { 'idempotency-key': key }) },
        });
      // POST is the root's: one key space, a key required.
      const first = await as('POST', 'alice', 'k');
      expect(first.json()).toEqual({ user: 'alice', run: 1 });
      const again = await as('POST', 'alice', 'k');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.json()).toEqual(first.json());
      expect((await as('POST', 'alice')).statusCode).toBe(400);
      expect(runs).toBe(1);
      if ('methods' in narrower) {
        // PUT is the child's: per user, with the root's required.
        expect((await as('PUT', 'alice', 'p')).json()).toEqual({ user: 'alice', run: 2 });
        const bob = await as('PUT', 'bob', 'p');
        expect(bob.headers['idempotent-replayed']).toBeUndefined();
        expect(bob.json()).toEqual({ user: 'bob', run: 3 });
        expect((await as('PUT', 'alice', 'p')).headers['idempotent-replayed']).toBe('true');
        expect((await as('PUT', 'bob')).statusCode).toBe(400);
        expect(runs).toBe(3);
      }
      await app.close();
    },
  );

  test('registering the plugin twice does not make a request conflict with itself', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin);
    await app.register(idempotencyPlugin);
    app.post('/twice', async () => ({ ok: true }));
    expect((await post(app, '/twice', 'k')).statusCode).toBe(200);
    expect((await post(app, '/twice', 'k')).headers['idempotent-replayed']).toBe('true');
    await app.close();
  });
});
