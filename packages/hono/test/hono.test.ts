import { IdempotencyOptionsError, MemoryStore } from '@oncely/core';
import { expectLeavingClientReleased, fetchHandlerClient } from '@oncely/testing';
import { withIdempotency } from '@oncely/web';
import { type Context, Hono } from 'hono';
import { compress } from 'hono/compress';
import { stream } from 'hono/streaming';
import { idempotency, scopeByHeader } from '../src';

const post = (app: Hono, path: string, key?: string, body = '{}', headers: Record<string, string> = {}) =>
  app.request(path, {
    method: 'POST',
    body,
    headers: {
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
      ...headers,
    },
  });

describe('@oncely/hono specifics', () => {
  // On @hono/node-server: the shared suite's "a client that leaves" (http.test.ts).
  test('elsewhere, a client that leaves while the store is asked is one whose signal aborted: answered 499, handled as one that left', () =>
    expectLeavingClientReleased(async (options) => {
      const app = new Hono();
      let runs = 0;
      app.use(idempotency(options));
      app.post('/charges', (c) => c.json({ run: ++runs }, 201));
      return fetchHandlerClient(app.fetch, 'http://localhost/charges', () => runs);
    }));

  test('a replay and a problem carry the headers outer middleware set before oncely this time (a request id, a session cookie), not the first request’s', async () => {
    const app = new Hono();
    let seq = 0;
    app.use(async (c, next) => {
      seq++;
      c.header('x-request-id', `req-${seq}`);
      c.header('set-cookie', `session=s${seq}; Path=/`);
      await next();
    });
    app.use(idempotency());
    let runs = 0;
    app.post('/charges', (c) => c.json({ run: ++runs }, 201));
    const first = await post(app, '/charges', 'outer-1');
    expect([first.headers.get('x-request-id'), first.headers.get('set-cookie')]).toEqual([
      'req-1',
      'session=s1; Path=/',
    ]);
    const replay = await post(app, '/charges', 'outer-1');
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect([replay.headers.get('x-request-id'), replay.headers.get('set-cookie')]).toEqual([
      'req-2',
      'session=s2; Path=/',
    ]);
    expect(await replay.json()).toEqual({ run: 1 });
    expect(replay.headers.get('content-type')).toMatch(/^application\/json/);
    const mismatch = await post(app, '/charges', 'outer-1', '{"other":1}');
    expect(mismatch.status).toBe(422);
    expect(mismatch.headers.get('x-request-id')).toBe('req-3');
    expect(mismatch.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(runs).toBe(1);
  });

  test('hono/streaming: a callback that throws ends the stream cleanly, so what it wrote is stored; a ReadableStream that errors releases the key', async () => {
    const app = new Hono();
    app.use(idempotency());
    let runs = 0;
    const fails = () => ++runs % 2 === 1;
    app.post('/helper', (c) =>
      stream(
        c,
        async (body) => {
          await body.write('part1;');
          if (fails()) throw new Error('the source failed');
          await body.write('part2;');
        },
        async () => {},
      ),
    );
    app.post('/readable', (c) =>
      c.body(
        new ReadableStream<Uint8Array>({
          start(controller) {
            controller.enqueue(new TextEncoder().encode('part1;'));
            if (fails()) controller.error(new Error('the source failed'));
            else {
              controller.enqueue(new TextEncoder().encode('part2;'));
              controller.close();
            }
          },
        }),
      ),
    );
    // Hono's helper catches the error and closes the stream: oncely sees a complete response, and stores it.
    expect(await (await post(app, '/helper', 'stream-1')).text()).toBe('part1;');
    const stored = await post(app, '/helper', 'stream-1');
    expect([stored.headers.get('idempotent-replayed'), await stored.text()]).toEqual(['true', 'part1;']);
    // A stream that errors fails the response (before a byte was sent here, so app.onError answers 500): the key is
    // released and the retry runs again.
    runs = 0;
    expect((await post(app, '/readable', 'stream-2')).status).toBe(500);
    const retry = await post(app, '/readable', 'stream-2');
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(await retry.text()).toBe('part1;part2;');
    expect(runs).toBe(2);
  });

  test('on one route, required: a request without a key gets 400; the others are untouched', async () => {
    const app = new Hono();
    let runs = 0;
    app.post('/charges', idempotency({ required: true }), (c) => c.json({ run: ++runs }, 201));
    app.post('/plain', (c) => c.json({ run: ++runs }));
    const missing = await post(app, '/charges');
    expect(missing.status).toBe(400);
    expect(((await missing.json()) as { type: string }).type).toBe('https://oncely.dev/problems/key-missing');
    await post(app, '/charges', 'k');
    expect((await post(app, '/charges', 'k')).headers.get('idempotent-replayed')).toBe('true');
    await post(app, '/plain', 'k');
    await post(app, '/plain', 'k');
    expect(runs).toBe(3);
  });

  test('app-wide and on the route: the first takes the request, the second does not conflict with it', async () => {
    const app = new Hono();
    let runs = 0;
    app.use(idempotency());
    app.post('/charges', idempotency({ required: true }), (c) => c.json({ run: ++runs }, 201));
    expect((await post(app, '/charges', 'twice')).status).toBe(201);
    expect((await post(app, '/charges', 'twice')).headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(1);
  });

  test('app-wide and on the route with other options: the route’s decide, over the app-wide one’s; the app-wide one’s elsewhere', async () => {
    const store = new MemoryStore();
    const app = new Hono();
    let runs = 0;
    app.use(idempotency({ store, scope: false }));
    // No store given: the app-wide one's, with this scope.
    app.post('/mine', idempotency({ scope: (c) => c.req.header('x-user') ?? '' }), (c) =>
      c.json({ user: c.req.header('x-user'), run: ++runs }, 201),
    );
    app.post('/public', (c) => c.json({ run: ++runs }, 201));
    const as = (path: string, user: string, key: string) => post(app, path, key, '{}', { 'x-user': user });
    expect(await (await as('/mine', 'alice', 'k')).json()).toEqual({ user: 'alice', run: 1 });
    const bob = await as('/mine', 'bob', 'k');
    expect(bob.headers.get('idempotent-replayed')).toBeNull();
    expect(await bob.json()).toEqual({ user: 'bob', run: 2 });
    expect((await as('/mine', 'alice', 'k')).headers.get('idempotent-replayed')).toBe('true');
    expect((await as('/public', 'alice', 'p')).status).toBe(201);
    expect((await as('/public', 'bob', 'p')).headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(3);
    expect(store.size).toBe(3);
  });

  test.each([
    ['app-wide before the route, another registered after it', 'after'],
    ['on the route, an app-wide one registered after it', 'route-first'],
    ['a middleware between an app-wide one and the route’s (which decides)', 'middleware-between'],
  ])(
    'only registrations matched before the handler count, the nearest of them deciding: %s',
    async (_name, layout) => {
      const app = new Hono();
      let runs = 0;
      const handler = (c: Context) => c.json({ run: ++runs, user: c.req.header('x-user') }, 201);
      const perUser = { required: true, scope: (c: Context) => `user:${c.req.header('x-user')}` };
      if (layout === 'after') {
        app.use(idempotency(perUser));
        app.post('/charges', handler);
        app.use('/charges', idempotency({ scope: false }));
      } else if (layout === 'route-first') {
        app.post('/charges', idempotency(perUser), handler);
        app.use(idempotency({ scope: false }));
      } else {
        app.use(idempotency({ scope: false }));
        app.use(async (c, next) => {
          c.header('x-seen', '1');
          await next();
        });
        app.post('/charges', idempotency(perUser), handler);
      }
      const as = (user: string, key?: string) => post(app, '/charges', key, '{}', { 'x-user': user });
      const alice = await as('alice', 'k');
      expect(alice.status).toBe(201);
      const again = await as('alice', 'k');
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(await again.json()).toEqual(await alice.json());
      const bob = await as('bob', 'k');
      expect(bob.headers.get('idempotent-replayed')).toBeNull();
      expect(await bob.json()).toEqual({ run: 2, user: 'bob' });
      expect((await as('alice')).status).toBe(400);
      expect(runs).toBe(2);
    },
  );
  test('a handler wrapped by withIdempotency behind the middleware, with another scope: refused with a 500, nothing stored', async () => {
    const app = new Hono();
    let runs = 0;
    app.use(idempotency({ scope: false }));
    const wrapped = withIdempotency(async () => Response.json({ run: ++runs }, { status: 201 }), {
      scope: (request) => request.headers.get('x-user') ?? '',
    });
    app.post('/charges', (c) => wrapped(c.req.raw));
    // The Request rebuilt before the wrapped handler gets it: still the same request.
    app.post('/rebuilt', async (c) =>
      wrapped(
        new Request(c.req.url, { method: 'POST', headers: c.req.raw.headers, body: await c.req.text() }),
      ),
    );
    for (const [path, user] of [
      ['/charges', 'alice'],
      ['/charges', 'bob'],
      ['/rebuilt', 'alice'],
      ['/rebuilt', 'bob'],
    ] as const) {
      const res = await post(app, path, 'k', '{}', { 'x-user': user });
      expect(res.status).toBe(500);
      expect(((await res.json()) as { type: string }).type).toBe(
        'https://oncely.dev/problems/conflicting-registrations',
      );
    }
    expect(runs).toBe(0);
  });

  test('a middleware that read the body before oncely (a validator) leaves the fingerprint and the handler working', async () => {
    const app = new Hono();
    let runs = 0;
    app.use(async (c, next) => {
      await c.req.json(); // what @hono/zod-validator does: consumes the raw body through Hono's cache
      await next();
    });
    app.use(idempotency());
    app.post('/charges', async (c) => c.json({ run: ++runs, body: await c.req.json() }, 201));
    const first = await post(app, '/charges', 'v', '{"a":1,"b":2}');
    expect(await first.json()).toEqual({ run: 1, body: { a: 1, b: 2 } });
    const replay = await post(app, '/charges', 'v', '{"b":2,"a":1}');
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect((await post(app, '/charges', 'v', '{"a":1,"b":3}')).status).toBe(422);
    expect(runs).toBe(1);
  });

  test('scope receives the Context: a user set by an earlier middleware namespaces keys', async () => {
    type AppEnv = { Variables: { user: string } };
    const app = new Hono<AppEnv>();
    let runs = 0;
    app.use(async (c, next) => {
      c.set('user', c.req.header('x-user') ?? 'anonymous');
      await next();
    });
    app.use(idempotency<AppEnv>({ scope: (c) => `user:${c.get('user')}` }));
    app.post('/charges', (c) => {
      const key: string | undefined = c.get('idempotencyKey'); // typed through ContextVariableMap
      return c.json({ run: ++runs, key }, 201);
    });
    const a = await post(app as unknown as Hono, '/charges', 'same', '{}', { 'x-user': 'a' });
    const b = await post(app as unknown as Hono, '/charges', 'same', '{}', { 'x-user': 'b' });
    expect(await a.json()).toEqual({ run: 1, key: 'same' });
    expect(await b.json()).toEqual({ run: 2, key: 'same' });
  });

  test('headers set by an earlier middleware (CORS) reach replays too; Set-Cookie never does', async () => {
    const app = new Hono();
    app.use(async (c, next) => {
      await next();
      c.header('access-control-allow-origin', '*');
    });
    app.use(idempotency({ store: new MemoryStore() }));
    app.post('/charges', (c) => {
      c.header('set-cookie', 'session=1');
      return c.json({ ok: true }, 201);
    });
    await post(app, '/charges', 'cors');
    const replay = await post(app, '/charges', 'cors');
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.headers.get('access-control-allow-origin')).toBe('*');
    expect(replay.headers.get('set-cookie')).toBeNull();
  });

  test('compress() outside oncely: the stored body is plain, each replay is encoded for the client asking', async () => {
    const app = new Hono();
    app.use(compress({ threshold: 0 }));
    app.use(idempotency());
    app.post('/charges', (c) => c.json({ text: 'x'.repeat(2000) }, 201));
    const first = await post(app, '/charges', 'gz', '{}', { 'accept-encoding': 'gzip' });
    expect(first.headers.get('content-encoding')).toBe('gzip');
    const plain = await post(app, '/charges', 'gz', '{}', { 'accept-encoding': 'identity' });
    expect(plain.headers.get('idempotent-replayed')).toBe('true');
    expect(plain.headers.get('content-encoding')).toBeNull();
    expect(((await plain.json()) as { text: string }).text).toHaveLength(2000);
  });

  test('what c.json, c.text and c.body were given is stored as it was sent, whatever happens to it after', async () => {
    const app = new Hono();
    app.use(idempotency());
    const runs: Record<string, number> = {};
    const run = (name: string) => {
      runs[name] = (runs[name] ?? 0) + 1;
    };
    // A toJSON that answers differently each time it is asked.
    let n = 0;
    app.post('/changing', (c) => {
      run('changing');
      return c.json({ v: { toJSON: () => ++n } }, 201);
    });
    // Values with no JSON text, or not text: Hono answers them, and so must a replay.
    app.post('/undefined', (c) => {
      run('undefined');
      return c.json(undefined as unknown as object);
    });
    app.post('/number', (c) => {
      run('number');
      return c.text(42 as unknown as string);
    });
    // The handler's own buffer, reused once the request is over.
    const shared = new Uint8Array(16).fill(65);
    const sharedArray = new ArrayBuffer(8);
    app.post('/bytes', (c) => {
      run('bytes');
      return c.body(shared);
    });
    app.post('/array-buffer', (c) => {
      run('arrayBuffer');
      return c.body(sharedArray);
    });
    for (const path of ['/changing', '/undefined', '/number', '/bytes', '/array-buffer']) {
      const first = await post(app, path, `own-${path}`);
      const sent = new Uint8Array(await first.arrayBuffer());
      shared.fill(66);
      new Uint8Array(sharedArray).fill(7);
      const replay = await post(app, path, `own-${path}`);
      expect([path, replay.status, replay.headers.get('idempotent-replayed')]).toEqual([
        path,
        first.status,
        'true',
      ]);
      expect([path, new Uint8Array(await replay.arrayBuffer())]).toEqual([path, sent]);
      expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'));
    }
    expect(runs).toEqual({ changing: 1, undefined: 1, number: 1, bytes: 1, arrayBuffer: 1 });
  });

  test('options are checked once, when the middleware is made', () => {
    expect(() => idempotency({ lockTimeout: -1 })).toThrow(IdempotencyOptionsError);
  });
});

test('@oncely/hono exports scopeByHeader, taking the Context, which isolates API keys', async () => {
  const app = new Hono();
  app.use(
    '*',
    idempotency({ scope: scopeByHeader('x-api-key', { secret: 'adapter-test-secret-0123456789' }) }),
  );
  let runs = 0;
  app.post('/charges', (c) => c.json({ run: ++runs }, 201));
  const send = (apiKey: string) => post(app, '/charges', 'same', '{}', { 'x-api-key': apiKey });
  expect((await send('k1')).status).toBe(201);
  expect((await send('k2')).status).toBe(201);
  expect((await send('k1')).headers.get('idempotent-replayed')).toBe('true');
  expect(runs).toBe(2);
});
