import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough, Readable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import compress from '@fastify/compress';
import { expectLeavingClientReleased, http2Post } from '@oncely/testing';
import Fastify, { type FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { idempotencyPlugin } from '../src';

// Every test here leaves a key behind that must be free (or settled) within a few seconds: with a lease of
// 300 ms that is renewed while the execution is unsettled, a key nobody settles stays locked (409) for good.
const LEASE = { lockTimeout: 300 };
const BOUND_MS = 3000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  /** The response ended early (the connection broke, or the test cut it). */
  aborted: boolean;
}

/** Retries `attempt` until `done` holds or the bound runs out; returns the last answer. */
async function eventually<T>(attempt: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  const deadline = Date.now() + BOUND_MS;
  for (;;) {
    const value = await attempt();
    if (done(value) || Date.now() > deadline) return value;
    await sleep(50);
  }
}

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' });
  const address = app.server.address();
  return `http://127.0.0.1:${typeof address === 'object' && address !== null ? address.port : 0}`;
}

async function close(app: FastifyInstance): Promise<void> {
  if (app.server.listening) app.server.closeAllConnections();
  await app.close();
}

/** A POST over a real connection (no keep-alive); `cutAfterBytes` drops the connection once that much arrived. */
function post(
  base: string,
  path: string,
  headers: Record<string, string>,
  options: { cutAfterBytes?: number; cutAfterMs?: number } = {},
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      `${base}${path}`,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } },
      (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        const finish = (aborted: boolean) =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: Buffer.concat(chunks),
            aborted,
          });
        res.on('data', (chunk: Buffer) => {
          chunks.push(chunk);
          size += chunk.byteLength;
          if (options.cutAfterBytes !== undefined && size >= options.cutAfterBytes) {
            req.destroy();
            finish(true);
          }
        });
        res.on('end', () => finish(false));
        res.on('error', () => finish(true));
        res.on('aborted', () => finish(true));
      },
    );
    req.on('error', (error) => (req.destroyed ? resolve(cut) : reject(error)));
    const cut: Answer = { status: 0, headers: {}, body: Buffer.alloc(0), aborted: true };
    if (options.cutAfterMs !== undefined) setTimeout(() => req.destroy(), options.cutAfterMs);
    req.end('{}');
  });
}

const inject = (app: FastifyInstance, url: string, key: string, headers: Record<string, string> = {}) =>
  app.inject({ method: 'POST', url, payload: {}, headers: { 'idempotency-key': key, ...headers } });

describe('@oncely/fastify: every response settles its key', () => {
  test('@fastify/compress before oncely: gzip replies are stored and replayed, not a locked 500', async () => {
    const app = Fastify();
    await app.register(compress); // its onSend runs before oncely's and hands over a pipe-only stream
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    const data = 'x'.repeat(5000);
    app.post('/gz', async () => ({ run: ++runs, data }));
    try {
      const first = await inject(app, '/gz', 'gz', { 'accept-encoding': 'gzip' });
      expect(first.statusCode).toBe(200);
      expect(first.headers['content-encoding']).toBe('gzip');
      expect(JSON.parse(gunzipSync(first.rawPayload).toString())).toEqual({ run: 1, data });
      const retry = await inject(app, '/gz', 'gz', { 'accept-encoding': 'gzip' });
      expect(retry.statusCode).toBe(200);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.rawPayload.equals(first.rawPayload)).toBe(true);
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  test('oncely before @fastify/compress: the identity body is stored; each answer is compressed on demand', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    await app.register(compress);
    let runs = 0;
    const data = 'y'.repeat(5000);
    app.post('/gz', async () => ({ run: ++runs, data }));
    try {
      const first = await inject(app, '/gz', 'gz', { 'accept-encoding': 'gzip' });
      expect(first.statusCode).toBe(200);
      expect(first.headers['content-encoding']).toBe('gzip');
      expect(JSON.parse(gunzipSync(first.rawPayload).toString())).toEqual({ run: 1, data });
      const plain = await inject(app, '/gz', 'gz');
      expect(plain.headers['idempotent-replayed']).toBe('true');
      expect(plain.headers['content-encoding']).toBeUndefined();
      expect(plain.json()).toEqual({ run: 1, data });
      const zipped = await inject(app, '/gz', 'gz', { 'accept-encoding': 'gzip' });
      expect(zipped.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(gunzipSync(zipped.rawPayload).toString())).toEqual({ run: 1, data });
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  test('a stream payload that is pipe-able but not async iterable is read, stored and replayed', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    app.post('/pipe-only', async (_request, reply) => {
      runs++;
      const stream = new PassThrough();
      // Like a readable-stream 2 / duplexify stream: .pipe, but no Symbol.asyncIterator.
      Object.defineProperty(stream, Symbol.asyncIterator, { value: undefined });
      setImmediate(() => stream.end('piped body'));
      reply.type('text/plain');
      return reply.send(stream);
    });
    try {
      const first = await inject(app, '/pipe-only', 'p');
      expect(first.statusCode).toBe(200);
      expect(first.body).toBe('piped body');
      const retry = await inject(app, '/pipe-only', 'p');
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toBe('piped body');
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  test('a stream that fails while it is read releases the key: the retry runs the handler again', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    app.post('/flaky', async (_request, reply) => {
      const run = ++runs;
      reply.type('application/octet-stream');
      return reply.send(
        Readable.from(
          (async function* () {
            yield Buffer.from('part one ');
            await sleep(5);
            if (run === 1) throw new Error('source failed');
            yield Buffer.from('part two');
          })(),
        ),
      );
    });
    try {
      expect((await inject(app, '/flaky', 'f')).statusCode).toBe(500);
      const retry = await eventually(
        () => inject(app, '/flaky', 'f'),
        (res) => res.statusCode !== 409,
      );
      expect(retry.statusCode).toBe(200);
      expect(retry.body).toBe('part one part two');
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(runs).toBe(2);
    } finally {
      await close(app);
    }
  });

  test('a hijacked reply settles the key when it ends: recorded as executed, never run again', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    app.post('/hijack', async (_request, reply) => {
      runs++;
      reply.hijack();
      reply.raw.writeHead(201, { 'content-type': 'text/plain' });
      reply.raw.end('written by hand');
    });
    try {
      const first = await inject(app, '/hijack', 'h');
      expect(first.statusCode).toBe(201);
      expect(first.body).toBe('written by hand');
      const retry = await eventually(
        () => inject(app, '/hijack', 'h'),
        (res) => res.statusCode !== 409,
      );
      expect(retry.statusCode).toBe(410);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.json()).toMatchObject({ originalStatus: 201 });
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  test('a client that goes away while the handler runs: the handler’s reply still settles the key', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    let finished!: () => void;
    const handlerDone = new Promise<void>((resolve) => {
      finished = resolve;
    });
    app.post('/slow', async (_request, reply) => {
      runs++;
      await sleep(300);
      reply.code(201);
      setImmediate(finished);
      return { run: runs };
    });
    try {
      const base = await listen(app);
      const gone = await post(base, '/slow', { 'idempotency-key': 's' }, { cutAfterMs: 50 });
      expect(gone.aborted).toBe(true);
      await handlerDone;
      const retry = await eventually(
        () => post(base, '/slow', { 'idempotency-key': 's' }),
        (res) => res.status !== 409,
      );
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body.toString())).toEqual({ run: 1 });
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  // HTTP/1.1: the shared suite's "a client that leaves" (http.test.ts).
  test('over HTTP/2: a client that cancels its stream while the store is asked is handled as one that left', () =>
    expectLeavingClientReleased(async (options) => {
      const app = Fastify({ http2: true });
      await app.register(idempotencyPlugin, options);
      let runs = 0;
      app.post('/left', async (_request, reply) => {
        runs++;
        reply.code(201);
        return { run: runs };
      });
      await app.listen({ port: 0, host: '127.0.0.1' });
      const origin = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
      return {
        // Node's HTTP/2 compatibility response has no `destroyed`; its stream is what is destroyed.
        leave: async (key, asked) => {
          await http2Post(origin, '/left', { 'idempotency-key': key }, { cancelWhen: asked });
        },
        retry: (key) => http2Post(origin, '/left', { 'idempotency-key': key }),
        runs: () => runs,
        close: () => app.close(),
      };
    }));
});

describe('@oncely/fastify: web Response payloads', () => {
  test('a Response with a non-cacheable status releases the key', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    app.post('/down', async () => {
      runs++;
      return new Response('down for now', { status: 503, headers: { 'retry-after': '1' } });
    });
    try {
      const first = await inject(app, '/down', 'r');
      expect(first.statusCode).toBe(503);
      expect(first.body).toBe('down for now');
      expect(first.headers['retry-after']).toBe('1');
      const retry = await eventually(
        () => inject(app, '/down', 'r'),
        (res) => res.statusCode !== 409,
      );
      expect(retry.statusCode).toBe(503);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(runs).toBe(2);
    } finally {
      await close(app);
    }
  });

  test('a Response replays with its own status, headers and body, byte for byte', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    let runs = 0;
    app.post('/created', async () => {
      runs++;
      return new Response(JSON.stringify({ id: 'ch_1', note: 'héllo' }), {
        status: 201,
        headers: { 'content-type': 'application/json', 'x-charge-id': 'ch_1' },
      });
    });
    try {
      const first = await inject(app, '/created', 'c');
      expect(first.statusCode).toBe(201);
      expect(first.headers['x-charge-id']).toBe('ch_1');
      const retry = await inject(app, '/created', 'c');
      expect(retry.statusCode).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.headers['x-charge-id']).toBe('ch_1');
      expect(retry.headers['content-type']).toBe('application/json');
      expect(retry.rawPayload.equals(first.rawPayload)).toBe(true);
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  test('a payload oncely cannot read releases the key instead of recording it as executed', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, {
      ...LEASE,
      logger: { debug() {}, info() {}, warn() {}, error() {} },
    });
    let runs = 0;
    // An instance hook runs before oncely's route hook; the first time it hands over something that is no body.
    app.addHook('onSend', async (_request, _reply, payload) => (runs === 1 ? { not: 'a body' } : payload));
    app.post('/odd', async () => ({ run: ++runs }));
    try {
      expect((await inject(app, '/odd', 'o')).statusCode).toBe(500);
      const retry = await eventually(
        () => inject(app, '/odd', 'o'),
        (res) => res.statusCode !== 409,
      );
      expect(retry.statusCode).toBe(200);
      expect(retry.json()).toEqual({ run: 2 });
      expect(runs).toBe(2);
    } finally {
      await close(app);
    }
  });
});

describe('@oncely/fastify: streams larger than maxBodyBytes', () => {
  const chunk = Buffer.alloc(100, 0x61);

  test('one that fails after the response started releases the key (it is not recorded as executed)', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, { ...LEASE, maxBodyBytes: 150 });
    let runs = 0;
    app.post('/big-flaky', async (_request, reply) => {
      const run = ++runs;
      reply.type('application/octet-stream');
      return reply.send(
        Readable.from(
          (async function* () {
            for (let i = 0; i < 5; i++) {
              await sleep(5);
              yield chunk;
            }
            if (run === 1) throw new Error('source failed half-way');
          })(),
        ),
      );
    });
    try {
      const base = await listen(app);
      const first = await post(base, '/big-flaky', { 'idempotency-key': 'b' });
      expect(first.status).toBe(200);
      expect(first.aborted).toBe(true); // truncated
      const retry = await eventually(
        () => post(base, '/big-flaky', { 'idempotency-key': 'b' }),
        (res) => res.status !== 409,
      );
      expect(retry.status).toBe(200);
      expect(retry.aborted).toBe(false);
      expect(retry.body.byteLength).toBe(500);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(runs).toBe(2);
      // Now it ran to the end: executed, its body too large to keep.
      const third = await post(base, '/big-flaky', { 'idempotency-key': 'b' });
      expect(third.status).toBe(410);
      expect(runs).toBe(2);
    } finally {
      await close(app);
    }
  });

  test('a client that goes away mid-stream: the source is destroyed and the key recorded as executed', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, { ...LEASE, maxBodyBytes: 150 });
    let runs = 0;
    let source: Readable | undefined;
    app.post('/endless', async (_request, reply) => {
      runs++;
      source = new Readable({
        read() {
          setTimeout(() => this.push(chunk), 5);
        },
      });
      reply.type('application/octet-stream');
      return reply.send(source);
    });
    try {
      const base = await listen(app);
      const gone = await post(base, '/endless', { 'idempotency-key': 'e' }, { cutAfterBytes: 1000 });
      expect(gone.aborted).toBe(true);
      const stream = source as Readable;
      await eventually(
        async () => stream.destroyed,
        (destroyed) => destroyed,
      );
      expect(stream.destroyed).toBe(true);
      const retry = await eventually(
        () => post(base, '/endless', { 'idempotency-key': 'e' }),
        (res) => res.status !== 409,
      );
      expect(retry.status).toBe(410);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });

  test('a client that left before the handler returned one: the source is not read on, the key recorded as executed', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, { ...LEASE, maxBodyBytes: 150 });
    let runs = 0;
    let source: Readable | undefined;
    app.post('/after-leaving', async (_request, reply) => {
      // Only the first run waits for its client to leave; a second one (a retry let through) answers at once.
      if (++runs === 1) await new Promise((resolve) => reply.raw.once('close', resolve));
      source = Readable.from([chunk, chunk, chunk, chunk]);
      reply.type('application/octet-stream');
      return reply.send(source);
    });
    try {
      const base = await listen(app);
      const leaving = httpRequest(`${base}/after-leaving`, {
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'idempotency-key': 'l' },
      });
      leaving.on('error', () => {});
      leaving.end('{}');
      // Gone once the handler runs (before that, the handler would not run at all).
      await eventually(
        async () => runs,
        (n) => n === 1,
      );
      leaving.destroy();
      await eventually(
        async () => source?.destroyed === true,
        (destroyed) => destroyed,
      );
      expect(source?.destroyed).toBe(true);
      const retry = await eventually(
        () => post(base, '/after-leaving', { 'idempotency-key': 'l' }),
        (res) => res.status !== 409,
      );
      expect(retry.status).toBe(410);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    } finally {
      await close(app);
    }
  });
});

describe('@oncely/fastify: payload handling', () => {
  test('a string reply is passed on as the bytes oncely already encoded', async () => {
    const app = Fastify();
    await app.register(idempotencyPlugin, LEASE);
    const seen: unknown[] = [];
    // A plugin registered after oncely: its route onSend hook runs after oncely's.
    await app.register(
      fp(async (instance) => {
        instance.addHook('onRoute', (route) => {
          const hooks =
            route.onSend === undefined ? [] : Array.isArray(route.onSend) ? route.onSend : [route.onSend];
          route.onSend = [
            ...hooks,
            async (_request, _reply, payload) => {
              seen.push(payload);
              return payload;
            },
          ];
        });
      }),
    );
    app.post('/text', async (_request, reply) => {
      reply.type('text/plain; charset=utf-8');
      return 'héllo wörld ✓';
    });
    try {
      const first = await inject(app, '/text', 't');
      expect(first.body).toBe('héllo wörld ✓');
      expect(first.headers['content-type']).toBe('text/plain; charset=utf-8');
      expect(Buffer.isBuffer(seen[0])).toBe(true);
      const retry = await inject(app, '/text', 't');
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.rawPayload.equals(first.rawPayload)).toBe(true);
    } finally {
      await close(app);
    }
  });
});
