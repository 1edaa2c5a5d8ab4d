import { request as httpRequest } from 'node:http';
import { createServer as createHttp2Server } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { inspect } from 'node:util';
import { bodyParser } from '@koa/bodyparser';
import Router from '@koa/router';
import { IdempotencyOptionsError, MemoryStore } from '@oncely/core';
import {
  binaryParser,
  expectedStream,
  expectLeavingClientReleased,
  http2Post,
  recordingLogger,
  sleep,
  waitUntil,
} from '@oncely/testing';
import Koa, { type Context } from 'koa';
import compress from 'koa-compress';
import request from 'supertest';
import { idempotency, type KoaIdempotencyOptions, scopeByHeader } from '../src';
import { jsonErrors, streamedBody } from './harness';

/** A Koa app with a body parser, oncely app-wide, and `route` as POST /r. */
function appWith(route: (ctx: Context) => unknown, options: KoaIdempotencyOptions = {}): Koa {
  const app = new Koa();
  app.silent = true;
  app.use(bodyParser());
  app.use(idempotency(options));
  app.use(async (ctx) => {
    await route(ctx);
  });
  return app;
}

const post = (app: Koa, key?: string, body: object | string = {}) => {
  const req = request(app.callback()).post('/r');
  if (key !== undefined) req.set('Idempotency-Key', key);
  return req.send(body);
};

/** Sends the same key twice: the handler must run once, and the replay must carry the first answer's bytes. */
async function firstAndReplay(app: Koa, runs: () => number) {
  const first = await post(app, 'k').buffer(true).parse(binaryParser);
  const replay = await post(app, 'k').buffer(true).parse(binaryParser);
  expect(runs()).toBe(1);
  expect(replay.headers['idempotent-replayed']).toBe('true');
  expect(replay.status).toBe(first.status);
  expect(replay.headers['content-type']).toBe(first.headers['content-type']);
  expect(replay.body).toEqual(first.body);
  return { first, replay };
}

describe('@oncely/koa: every kind of ctx.body is stored as the bytes Koa sends', () => {
  // [what ctx.body is, a fresh one, the content type Koa gives it]
  const cases: [string, () => unknown, string][] = [
    ['a string', () => 'plain text', 'text/plain; charset=utf-8'],
    ['HTML in a string', () => '<p>hi</p>', 'text/html; charset=utf-8'],
    ['a Buffer', () => Buffer.from([0, 1, 2, 255]), 'application/octet-stream'],
    ['an object', () => ({ a: 1, nested: { b: [1, 2] } }), 'application/json; charset=utf-8'],
    ['an array', () => [1, 'two'], 'application/json; charset=utf-8'],
    ['a Node stream', () => streamedBody(), 'application/octet-stream'],
    ['a web ReadableStream', () => new Blob([expectedStream()]).stream(), 'application/octet-stream'],
    ['a Blob', () => new Blob(['blob body'], { type: 'text/csv' }), 'text/csv; charset=utf-8'],
    ['a Response', () => new Response('from a Response'), 'text/plain;charset=UTF-8'],
    ['a Node stream of strings', () => Readable.from(['a', 'é', 'c']), 'application/octet-stream'],
  ];

  test.each(cases)(
    '%s: the handler runs once, the replay is the same bytes and type',
    async (_name, make, type) => {
      let runs = 0;
      const app = appWith((ctx) => {
        runs++;
        ctx.body = make();
      });
      const { first } = await firstAndReplay(app, () => runs);
      expect(first.headers['content-type']).toBe(type);
    },
  );

  test('a Response body keeps its status and headers on the replay', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.body = new Response('made', { status: 202, headers: { 'x-from': 'response' } });
    });
    const { replay } = await firstAndReplay(app, () => runs);
    expect(replay.status).toBe(202);
    expect(replay.headers['x-from']).toBe('response');
    expect(replay.body.toString()).toBe('made');
  });

  test('no body: the status text Koa sends is stored, and a status set alone keeps its code', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.status = 201;
    });
    const { first } = await firstAndReplay(app, () => runs);
    expect(first.status).toBe(201);
    expect(first.body.toString()).toBe('Created');
  });

  test("nothing answered at all: ctx is left alone for the app's own not-found answer, nothing is stored", async () => {
    let runs = 0;
    const app = new Koa();
    app.use(async (ctx, next) => {
      await next();
      if (ctx.status === 404 && ctx.body == null) {
        ctx.status = 404;
        ctx.body = { error: 'no such route' };
      }
    });
    app.use(bodyParser());
    app.use(idempotency());
    app.use(() => {
      runs++;
    });
    const first = await post(app, 'k');
    expect(first.status).toBe(404);
    expect(first.body).toEqual({ error: 'no such route' });
    const again = await post(app, 'k');
    expect(again.body).toEqual({ error: 'no such route' });
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(runs).toBe(2);
  });

  test('ctx.body = null: an empty 204, replayed as one', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.body = null;
    });
    const { first } = await firstAndReplay(app, () => runs);
    expect(first.status).toBe(204);
  });

  test('ctx.body = null, then a status: an empty body without a type, replayed as one', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.body = null;
      ctx.status = 200;
    });
    const { first, replay } = await firstAndReplay(app, () => runs);
    expect(first.status).toBe(200);
    expect(first.headers['content-type']).toBeUndefined();
    expect(replay.headers['content-type']).toBeUndefined();
    expect(replay.body).toEqual(Buffer.alloc(0));
  });

  test('a JSON null body', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.status = 200;
      ctx.type = 'json';
      ctx.body = null;
    });
    const { first } = await firstAndReplay(app, () => runs);
    expect(first.status).toBe(200);
    expect(first.body.toString()).toBe('null');
  });
});

describe('@oncely/koa specifics', () => {
  test('on one @koa/router route, required: a request without a key gets 400; other routes are untouched', async () => {
    const app = new Koa();
    app.use(bodyParser());
    const router = new Router();
    let runs = 0;
    router.post('/charges', idempotency({ required: true }), (ctx) => {
      ctx.status = 201;
      ctx.body = { run: ++runs, key: ctx.state.idempotencyKey };
    });
    router.post('/plain', (ctx) => {
      ctx.body = { run: ++runs, key: ctx.state.idempotencyKey ?? null };
    });
    app.use(router.routes());
    const server = request(app.callback());
    const missing = await server.post('/charges').send({});
    expect(missing.status).toBe(400);
    expect(missing.headers['content-type']).toBe('application/problem+json');
    expect(missing.body.type).toBe('https://oncely.dev/problems/key-missing');
    const first = await server.post('/charges').set('Idempotency-Key', 'rk').send({});
    expect(first.body).toEqual({ run: 1, key: 'rk' });
    const replay = await server.post('/charges').set('Idempotency-Key', 'rk').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ run: 1, key: 'rk' });
    expect((await server.post('/plain').set('Idempotency-Key', 'rk').send({})).body).toEqual({
      run: 2,
      key: null,
    });
    expect((await server.post('/plain').set('Idempotency-Key', 'rk').send({})).body).toEqual({
      run: 3,
      key: null,
    });
  });

  test('app-wide and on the route: the first takes the request, the second does not conflict with it', async () => {
    // One store for both, so that a second middleware taking the request would meet the first one's lease.
    const store = new MemoryStore();
    const app = new Koa();
    app.use(bodyParser());
    app.use(idempotency({ store }));
    const router = new Router();
    let runs = 0;
    router.post('/charges', idempotency({ store, required: true }), (ctx) => {
      ctx.status = 201;
      ctx.body = { run: ++runs };
    });
    app.use(router.routes());
    const server = request(app.callback());
    expect((await server.post('/charges').set('Idempotency-Key', 'twice').send({})).status).toBe(201);
    const replay = await server.post('/charges').set('Idempotency-Key', 'twice').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
  });

  test('the fingerprint sees the parsed body: key order does not matter, a different body is a 422', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.body = { ok: true };
    });
    await post(app, 'fp', { a: 1, b: 2 });
    expect((await post(app, 'fp', '{"b":2,"a":1}').type('json')).headers['idempotent-replayed']).toBe('true');
    expect((await post(app, 'fp', { a: 1, b: 3 })).status).toBe(422);
    expect(runs).toBe(1);
  });

  test('a body the parser left alone (text, by default): one warning, and `{}` is not taken for the body', async () => {
    const logger = recordingLogger();
    let runs = 0;
    const app = appWith(
      (ctx) => {
        runs++;
        ctx.body = { ok: true };
      },
      { logger },
    );
    const send = (text: string) =>
      request(app.callback()).post('/r').set('Idempotency-Key', 'txt').type('text/plain').send(text);
    expect((await send('first')).status).toBe(200);
    await send('second');
    const warnings = logger.lines.filter(
      (line) => line.level === 'warn' && /body parser/.test(line.msg ?? ''),
    );
    expect(warnings).toHaveLength(1);
    expect(runs).toBe(1);

    // With text parsing on, the two bodies are told apart.
    const parsing = new Koa();
    let parsedRuns = 0;
    parsing.use(bodyParser({ enableTypes: ['json', 'form', 'text'] }));
    parsing.use(idempotency());
    parsing.use((ctx) => {
      parsedRuns++;
      ctx.body = { ok: true };
    });
    const sendParsed = (text: string) =>
      request(parsing.callback()).post('/r').set('Idempotency-Key', 'txt').type('text/plain').send(text);
    expect((await sendParsed('first')).status).toBe(200);
    expect((await sendParsed('second')).status).toBe(422);
    expect(parsedRuns).toBe(1);
  });

  test('a JSON body a parser without JSON left as {}: one warning, and {} is not taken for the body', async () => {
    const logger = recordingLogger();
    const app = new Koa();
    app.use(bodyParser({ enableTypes: ['form'] }));
    app.use(idempotency({ logger }));
    app.use((ctx) => {
      ctx.body = { ok: true };
    });
    await request(app.callback()).post('/r').set('Idempotency-Key', 'j').send({ amount: 1 }).expect(200);
    expect(logger.lines.filter((l) => l.level === 'warn' && /was not parsed/.test(l.msg ?? ''))).toHaveLength(
      1,
    );
  });

  test('a JSON {} the parser read, or a request without a body, is no unparsed body', async () => {
    const logger = recordingLogger();
    const app = new Koa();
    app.use(bodyParser());
    app.use(idempotency({ logger }));
    app.use((ctx) => {
      ctx.body = { got: ctx.request.body };
    });
    const post = (key: string) => request(app.callback()).post('/r').set('Idempotency-Key', key);
    await post('e').send({}).expect(200);
    await post('n').expect(200);
    await post('t').type('text/plain').expect(200);
    expect(logger.lines.filter((l) => l.level === 'warn' && /was not parsed/.test(l.msg ?? ''))).toHaveLength(
      0,
    );
    await post('e').send({ amount: 1 }).expect(422);
    expect((await post('e').send({})).headers['idempotent-replayed']).toBe('true');
  });

  test('a thrown error releases the key and goes on to the error handling; a retry runs again', async () => {
    let runs = 0;
    const app = new Koa();
    app.silent = true;
    app.use(jsonErrors);
    app.use(bodyParser());
    app.use(idempotency());
    app.use((ctx) => {
      runs++;
      if (runs === 1) ctx.throw(422, 'invalid card');
      ctx.body = { run: runs };
    });
    const first = await post(app, 'e');
    expect(first.status).toBe(422);
    expect(first.body).toEqual({ error: 'invalid card' });
    expect((await post(app, 'e')).body).toEqual({ run: 2 });
    expect((await post(app, 'e')).headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(2);
  });

  test('an object JSON.stringify cannot serialise: a 500, the key released', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.body = runs === 1 ? { amount: 10n } : { amount: '10' };
    });
    expect((await post(app, 'big')).status).toBe(500);
    expect((await post(app, 'big')).body).toEqual({ amount: '10' });
    expect(runs).toBe(2);
  });

  test('a stream body that fails before its end: nothing was sent, so the key is released', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.type = 'application/octet-stream';
      ctx.body =
        runs === 1
          ? Readable.from(
              (async function* () {
                yield Buffer.from('part');
                throw new Error('disk gone');
              })(),
            )
          : Buffer.from('whole');
    });
    expect((await post(app, 's')).status).toBe(500);
    const second = await post(app, 's').buffer(true).parse(binaryParser);
    expect(second.body.toString()).toBe('whole');
    expect(runs).toBe(2);
  });

  test('a stream over maxBodyBytes streams through whole; the retry gets 410 and the handler never runs again', async () => {
    let runs = 0;
    const app = appWith(
      (ctx) => {
        runs++;
        ctx.type = 'application/octet-stream';
        ctx.body = streamedBody();
      },
      { maxBodyBytes: 2500 },
    );
    const first = await post(app, 'big').buffer(true).parse(binaryParser);
    expect(first.status).toBe(200);
    expect(first.body).toEqual(expectedStream());
    const retry = await post(app, 'big');
    expect(retry.status).toBe(410);
    expect(runs).toBe(1);
  });

  test('a stream over maxBodyBytes that then yields a non-byte chunk: the response fails, no unhandled rejection', async () => {
    // The real process's emitter: the test's `process` is a copy that does not hear Node's events.
    const host = (inspect.constructor as FunctionConstructor)('return process')() as NodeJS.Process;
    const escaped: unknown[] = [];
    const onEscape = (error: unknown) => void escaped.push(error);
    host.on('unhandledRejection', onEscape);
    host.on('uncaughtException', onEscape);
    try {
      let runs = 0;
      const app = appWith(
        (ctx) => {
          runs++;
          ctx.type = 'application/octet-stream';
          ctx.body = Readable.from([Buffer.alloc(3000), { not: 'bytes' }], { objectMode: true });
        },
        { maxBodyBytes: 1000 },
      );
      // Part of the body was sent: the response can only be cut short.
      await expect(post(app, 'odd-chunk')).rejects.toThrow();
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(escaped).toEqual([]);
      // A stream that fails part-way is a failed handler, whatever its size: the key is released and the retry runs
      // the handler again (it fails the same way here).
      await expect(post(app, 'odd-chunk')).rejects.toThrow();
      expect(runs).toBe(2);
    } finally {
      host.off('unhandledRejection', onEscape);
      host.off('uncaughtException', onEscape);
    }
  });

  test('ctx.respond = false (the handler writes ctx.res itself): kept as executed, never run twice', async () => {
    let runs = 0;
    const app = appWith((ctx) => {
      runs++;
      ctx.respond = false;
      ctx.res.statusCode = 201;
      ctx.res.end('raw');
    });
    const first = await post(app, 'raw');
    expect(first.status).toBe(201);
    expect(first.text).toBe('raw');
    const retry = await post(app, 'raw');
    expect(retry.status).toBe(410);
    expect(runs).toBe(1);
  });

  test('koa-compress mounted before oncely: plain bytes stored, each client gets what it accepts', async () => {
    let runs = 0;
    const app = new Koa();
    app.use(compress({ threshold: 0 }));
    app.use(bodyParser());
    app.use(idempotency());
    app.use((ctx) => {
      runs++;
      ctx.body = { text: 'z'.repeat(2000) };
    });
    const server = request(app.callback());
    const gzipped = await server
      .post('/r')
      .set('Idempotency-Key', 'gz')
      .set('Accept-Encoding', 'gzip')
      .send({})
      .buffer(true)
      .parse(binaryParser);
    expect(gzipped.headers['content-encoding']).toBe('gzip');
    // superagent gunzips what it receives: the header says the client got gzip.
    expect(JSON.parse((gzipped.body as Buffer).toString())).toEqual({ text: 'z'.repeat(2000) });
    const identity = await server
      .post('/r')
      .set('Idempotency-Key', 'gz')
      .set('Accept-Encoding', 'identity')
      .send({});
    expect(identity.headers['idempotent-replayed']).toBe('true');
    expect(identity.headers['content-encoding']).toBeUndefined();
    expect(identity.body).toEqual({ text: 'z'.repeat(2000) });
    expect(runs).toBe(1);
  });

  test('headers set by an earlier middleware reach replays too; Set-Cookie never does', async () => {
    const app = new Koa();
    app.use(async (ctx, next) => {
      ctx.set('access-control-allow-origin', '*');
      await next();
    });
    app.use(bodyParser());
    app.use(idempotency({ store: new MemoryStore() }));
    app.use((ctx) => {
      ctx.cookies.set('session', 'abc');
      ctx.body = { ok: true };
    });
    const server = request(app.callback());
    const first = await server.post('/r').set('Idempotency-Key', 'h').send({});
    expect(first.headers['set-cookie']).toBeDefined();
    const replay = await server.post('/r').set('Idempotency-Key', 'h').send({});
    expect(replay.headers['access-control-allow-origin']).toBe('*');
    expect(replay.headers['set-cookie']).toBeUndefined();
  });

  test('scope receives the Context: a user set by an earlier middleware namespaces keys', async () => {
    let runs = 0;
    const app = new Koa();
    app.use(async (ctx, next) => {
      ctx.state.user = ctx.get('x-user');
      await next();
    });
    app.use(bodyParser());
    app.use(idempotency({ scope: (ctx) => String(ctx.state.user) }));
    app.use((ctx) => {
      ctx.body = { run: ++runs };
    });
    const as = (user: string) =>
      request(app.callback()).post('/r').set('x-user', user).set('Idempotency-Key', 'same').send({});
    expect((await as('alice')).body).toEqual({ run: 1 });
    expect((await as('bob')).body).toEqual({ run: 2 });
    expect((await as('alice')).body).toEqual({ run: 1 });
    expect(runs).toBe(2);
  });

  test('options are checked once, when the middleware is made, naming the option', () => {
    expect(() => idempotency({ ttl: 'soon' as never })).toThrow(IdempotencyOptionsError);
    expect(() => idempotency({ ttl: 'soon' as never })).toThrow(/ttl/);
  });

  test('returns a named middleware; the default export is the same factory', async () => {
    expect(idempotency().name).toBe('idempotencyMiddleware');
    expect((await import('../src')).default).toBe(idempotency);
  });

  test('a middleware before oncely that reads ctx.body sees the same on the first response and on a replay', async () => {
    let runs = 0;
    const app = new Koa();
    app.use(async (ctx, next) => {
      await next();
      ctx.body = { wrapped: Buffer.isBuffer(ctx.body) ? JSON.parse(ctx.body.toString()) : ctx.body };
    });
    app.use(bodyParser());
    app.use(idempotency());
    app.use((ctx) => {
      runs++;
      ctx.body = { id: 1 };
    });
    const first = await post(app, 'env');
    const replay = await post(app, 'env');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual(first.body);
    expect(first.body).toEqual({ wrapped: { id: 1 } });
    expect(runs).toBe(1);
  });

  test("headers set before oncely ran are the outer middleware's: fresh on each replay, never stored", async () => {
    let requests = 0;
    const app = new Koa();
    app.use(async (ctx, next) => {
      ctx.set('x-request-id', `req-${++requests}`);
      ctx.set('access-control-allow-origin', ctx.get('origin'));
      await next();
    });
    app.use(bodyParser());
    app.use(idempotency());
    app.use((ctx) => {
      ctx.set('x-charge', 'ch_1');
      ctx.body = { ok: true };
    });
    const server = request(app.callback());
    const first = await server
      .post('/r')
      .set('Origin', 'https://a.example')
      .set('Idempotency-Key', 'o')
      .send({});
    const replay = await server
      .post('/r')
      .set('Origin', 'https://b.example')
      .set('Idempotency-Key', 'o')
      .send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['x-request-id']).toBe('req-1');
    expect(replay.headers['x-request-id']).toBe('req-2');
    expect(replay.headers['access-control-allow-origin']).toBe('https://b.example');
    expect(replay.headers['x-charge']).toBe('ch_1');
  });

  test('ctx.respond = false: a duplicate while the response is open gets 409; one after it ended, 410', async () => {
    let runs = 0;
    const app = appWith(async (ctx) => {
      runs++;
      ctx.respond = false;
      ctx.res.writeHead(200, { 'content-type': 'text/plain' });
      ctx.res.write('first part ');
      await sleep(300);
      ctx.res.end('done');
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      // then() sends it now (supertest sends on then or end).
      const first = request(url)
        .post('/r')
        .set('Idempotency-Key', 'open')
        .send({})
        .then((res) => res);
      await sleep(100);
      const during = await request(url).post('/r').set('Idempotency-Key', 'open').send({});
      expect(during.status).toBe(409);
      expect((await first).text).toBe('first part done');
      await waitUntil(
        async () => (await request(url).post('/r').set('Idempotency-Key', 'open').send({})).status === 410,
        'the finished response recorded as executed',
      );
      expect(runs).toBe(1);
    } finally {
      server.close();
    }
  });

  test('ctx.respond = false with the response ended before the middleware resumes: kept, not locked for good', async () => {
    let runs = 0;
    const app = appWith(async (ctx) => {
      runs++;
      ctx.respond = false;
      ctx.res.end('raw');
      await sleep(50);
    });
    expect((await post(app, 'ended')).text).toBe('raw');
    await sleep(100);
    expect((await post(app, 'ended')).status).toBe(410);
    expect(runs).toBe(1);
  });

  // HTTP/1.1: the shared suite's "a client that leaves" (http.test.ts).
  test('over HTTP/2: a client that cancels its stream while the store is asked is handled as one that left', () =>
    expectLeavingClientReleased(async (options) => {
      let runs = 0;
      const app = appWith((ctx) => {
        ctx.status = 201;
        ctx.body = { run: ++runs };
      }, options);
      const server = createHttp2Server(app.callback());
      server.listen(0, '127.0.0.1');
      await new Promise((resolve) => server.once('listening', resolve));
      const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      return {
        // Node's HTTP/2 compatibility response has no `destroyed`; its stream is what is destroyed.
        leave: async (key, asked) => {
          await http2Post(origin, '/r', { 'idempotency-key': key }, { cancelWhen: asked });
        },
        retry: (key) => http2Post(origin, '/r', { 'idempotency-key': key }),
        runs: () => runs,
        close: () => new Promise<void>((resolve) => server.close(() => resolve())),
      };
    }));

  test('a client that leaves while a stream body is read: the handler ran, so a retry gets 410, never a second run', async () => {
    let runs = 0;
    const app = appWith(async (ctx) => {
      runs++;
      await sleep(150);
      ctx.type = 'application/octet-stream';
      ctx.body = streamedBody();
    });
    await abortedPost(app, 'left', 50);
    await sleep(400);
    expect((await post(app, 'left')).status).toBe(410);
    expect(runs).toBe(1);
  });

  test('a client that leaves before a body over maxBodyBytes is sent: kept as executed, the key never stays locked', async () => {
    let runs = 0;
    const app = appWith(
      async (ctx) => {
        runs++;
        await sleep(150);
        ctx.type = 'application/octet-stream';
        ctx.body = new Blob([Buffer.alloc(1000, 1)]).stream();
      },
      { maxBodyBytes: 10, lockTimeout: '300ms' },
    );
    await abortedPost(app, 'big-left', 50);
    await sleep(1000);
    expect((await post(app, 'big-left')).status).toBe(410);
    expect(runs).toBe(1);
  });
});

/** Sends a POST with the key from a client that disconnects after `ms`; resolves once the server saw the request end. */
async function abortedPost(app: Koa, key: string, ms: number): Promise<void> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const { port } = server.address() as AddressInfo;
  const req = httpRequest({
    port,
    host: '127.0.0.1',
    method: 'POST',
    path: '/r',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
  });
  req.on('error', () => {});
  req.end('{}');
  await sleep(ms);
  req.destroy();
  await sleep(300);
  await new Promise((resolve) => server.close(resolve));
}

test('@oncely/koa exports scopeByHeader, which isolates API keys', async () => {
  let runs = 0;
  const app = appWith(
    (ctx) => {
      ctx.status = 201;
      ctx.body = { run: ++runs };
    },
    { scope: scopeByHeader('x-api-key', { secret: 'adapter-test-secret-0123456789' }) },
  );
  const send = (apiKey: string) =>
    request(app.callback()).post('/r').set('Idempotency-Key', 'same').set('x-api-key', apiKey).send({});
  await send('k1').expect(201);
  await send('k2').expect(201);
  expect((await send('k1')).headers['idempotent-replayed']).toBe('true');
  expect(runs).toBe(2);
});
