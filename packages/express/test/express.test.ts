import { createServer, IncomingMessage, OutgoingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import { IdempotencyOptionsError, type IdempotencyStore, MemoryStore } from '@oncely/core';
import { brokenStore, gatedStore, recordingLogger, until } from '@oncely/testing';
import compression from 'compression';
import express from 'express';
import express4 from 'express4';
import morgan from 'morgan';
import request from 'supertest';
import idempotencyDefault, { idempotency, scopeByHeader } from '../src';

// Node's own methods as this file found them: oncely must leave them as they are.
/**
 * `store`, and `settled()`: resolves once its acquire of `key` answered and the key is no longer in progress
 * (released, completed or gone), that is once the middleware has done all it will with it; polled, bounded.
 */
function settling(store: IdempotencyStore, memory: MemoryStore, key: string) {
  let acquired = false;
  const wrapped: IdempotencyStore = {
    ...store,
    acquire: async (...args: Parameters<IdempotencyStore['acquire']>) => {
      const result = await store.acquire(...args);
      acquired = true;
      return result;
    },
  };
  const settled = () =>
    until(async () => acquired && (await memory.get(key))?.state !== 'in_progress', 10_000);
  return { store: wrapped, settled };
}

const pristine = {
  write: ServerResponse.prototype.write,
  end: ServerResponse.prototype.end,
  writeHead: ServerResponse.prototype.writeHead,
};

const versions = [
  ['Express 5', express],
  ['Express 4', express4 as unknown as typeof express],
] as const;

describe.each(versions)('%s specifics', (_name, expressModule) => {
  test('an error an error handler recovers from (it calls next()) is no failure: the answer is stored', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency());
    let runs = 0;
    app.post(
      '/recovered',
      (_req: express.Request, _res: express.Response, next: express.NextFunction) =>
        next(Object.assign(new Error('cache miss'), { status: 503 })),
      (_error: unknown, _req: express.Request, _res: express.Response, next: express.NextFunction) => next(),
      (_req: express.Request, res: express.Response) => void res.status(201).json({ run: ++runs }),
    );
    await request(app).post('/recovered').set('Idempotency-Key', 'k1').send({}).expect(201);
    const replay = await request(app).post('/recovered').set('Idempotency-Key', 'k1').send({});
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
  });

  test('an error passed on: a 5xx answer releases the key; a 4xx one too with idempotency.errors(), else it is stored', async () => {
    const make = (observe: boolean) => {
      const app = expressModule();
      app.use(expressModule.json());
      app.use(idempotency());
      let runs = 0;
      app.post('/fails', (req, _res, next) => {
        runs++;
        next(Object.assign(new Error('declined'), { status: Number(req.query.status) }));
      });
      if (observe) app.use(idempotency.errors());
      app.use(
        (err: Error & { status: number }, _req: express.Request, res: express.Response, _next: unknown) => {
          res.status(err.status).json({ error: err.message });
        },
      );
      return { app, runs: () => runs };
    };
    const twice = async (app: express.Express, status: number) => {
      for (let i = 0; i < 2; i++)
        await request(app)
          .post(`/fails?status=${status}`)
          .set('Idempotency-Key', `e${status}`)
          .send({})
          .expect(status);
    };
    const plain = make(false);
    await twice(plain.app, 500);
    expect(plain.runs()).toBe(2);
    await twice(plain.app, 402);
    expect(plain.runs()).toBe(3);
    const observed = make(true);
    await twice(observed.app, 402);
    expect(observed.runs()).toBe(2);
    // Express's own error handler answers 500: released without anything mounted.
    const bare = expressModule();
    bare.use(idempotency());
    let runs = 0;
    bare.post('/fails', (_req, _res, next) => {
      runs++;
      next(new Error('boom'));
    });
    for (let i = 0; i < 2; i++) await request(bare).post('/fails').set('Idempotency-Key', 'd').expect(500);
    expect(runs).toBe(2);
  });

  test('an app-wide and a route-level middleware compose: the first takes the request', async () => {
    const store = new MemoryStore();
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ store }));
    let runs = 0;
    app.post('/charges', idempotency({ store, required: true }), (_req, res) => {
      res.status(201).json({ run: ++runs });
    });
    await request(app).post('/charges').set('Idempotency-Key', 'k1').send({}).expect(201);
    const replay = await request(app).post('/charges').set('Idempotency-Key', 'k1').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    // Without a key the app-wide one steps aside and the route-level one requires it.
    await request(app).post('/charges').send({}).expect(400);
    expect(runs).toBe(1);
  });

  test('a route-level middleware that sets a deciding option otherwise refuses the request, naming both; the same values are fine', async () => {
    const store = new MemoryStore();
    const scope = (req: { headers: Record<string, unknown> }) => String(req.headers['x-user']);
    const logger = recordingLogger();
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ store, scope, logger }));
    let runs = 0;
    const handler = (_req: unknown, res: express.Response) => void res.status(201).json({ run: ++runs });
    // The same store and scope function, a key required, another logger: nothing decides otherwise.
    app.post('/same', idempotency({ store, scope, required: true, logger: recordingLogger() }), handler);
    app.post('/ttl', idempotency({ ttl: '1h' }), handler);
    const key = 'k1';
    await request(app).post('/same').set('Idempotency-Key', key).set('x-user', 'a').send({}).expect(201);
    const replay = await request(app).post('/same').set('Idempotency-Key', key).set('x-user', 'a').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    const refused = await request(app).post('/ttl').set('Idempotency-Key', 'k2').set('x-user', 'a').send({});
    expect(refused.status).toBe(500);
    expect(refused.body.type).toBe('https://oncely.dev/problems/conflicting-registrations');
    // Both named in the log by where they were created (this file, two lines); the client sees no source path.
    expect(refused.body.detail).toMatch(/ttl/);
    expect(refused.body.detail).not.toMatch(/express\.test\.ts/);
    const errors = logger.lines.filter((line) => line.level === 'error');
    expect(errors).toHaveLength(1);
    expect(errors[0]?.msg?.match(/express\.test\.ts:\d+:\d+/g)).toHaveLength(2);
    expect(runs).toBe(1);
    // Released, not stored: the key runs where the app-wide one covers it alone.
    await request(app).post('/same').set('Idempotency-Key', 'k2').set('x-user', 'a').send({}).expect(201);
    expect(runs).toBe(2);
  });

  test("headers set before oncely ran (CORS, a request id) are fresh on a replay; the handler's are stored", async () => {
    const app = expressModule();
    let requests = 0;
    app.use((req, res, next) => {
      res.setHeader('x-request-id', `req-${++requests}`);
      res.setHeader('access-control-allow-origin', String(req.headers.origin));
      next();
    });
    app.use(expressModule.json());
    app.use(idempotency());
    app.post('/charges', (_req, res) => {
      res.setHeader('x-charge', 'ch_1');
      res.status(201).json({ ok: true });
    });
    const send = (origin: string) =>
      request(app).post('/charges').set('Origin', origin).set('Idempotency-Key', 'cors').send({});
    const first = await send('https://a.example');
    const replay = await send('https://b.example');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(first.headers['x-request-id']).toBe('req-1');
    expect(replay.headers['x-request-id']).toBe('req-2');
    expect(replay.headers['access-control-allow-origin']).toBe('https://b.example');
    expect(replay.headers['x-charge']).toBe('ch_1');
  });

  test('only the route it is mounted on is covered', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    let runs = 0;
    app.post('/covered', idempotency(), (_req, res) => void res.status(201).json({ run: ++runs }));
    app.post('/open', (_req, res) => void res.status(201).json({ run: ++runs }));
    await request(app).post('/covered').set('Idempotency-Key', 'a').send({});
    await request(app).post('/covered').set('Idempotency-Key', 'a').send({});
    await request(app).post('/open').set('Idempotency-Key', 'a').send({});
    await request(app).post('/open').set('Idempotency-Key', 'a').send({});
    expect(runs).toBe(3);
  });

  test('writeHead with a status message and headers, then a pipe, replays faithfully', async () => {
    const app = expressModule();
    let runs = 0;
    app.use(idempotency());
    app.post('/piped', (_req, res) => {
      runs++;
      res.writeHead(202, 'Accepted For Later', { 'content-type': 'text/csv', 'x-rows': '3' });
      Readable.from(['a,b\n', '1,2\n', '3,4\n']).pipe(res);
    });
    const first = await request(app).post('/piped').set('Idempotency-Key', 'p');
    expect(first.status).toBe(202);
    expect(first.text).toBe('a,b\n1,2\n3,4\n');
    const replay = await request(app).post('/piped').set('Idempotency-Key', 'p');
    expect(replay.status).toBe(202);
    expect(replay.headers['x-rows']).toBe('3');
    expect(replay.headers['content-type']).toBe('text/csv');
    expect(replay.text).toBe(first.text);
    expect(runs).toBe(1);
  });

  test('write and end callbacks still fire', async () => {
    const app = expressModule();
    app.use(idempotency());
    const fired: string[] = [];
    app.post('/cb', (_req, res) => {
      res.write('a', () => fired.push('write'));
      res.end('b', () => fired.push('end'));
    });
    await request(app).post('/cb').set('Idempotency-Key', 'cb').expect(200);
    await new Promise((resolve) => setImmediate(resolve));
    expect(fired.sort()).toEqual(['end', 'write']);
  });

  test('warns once when the body was not parsed, because the fingerprint cannot see it', async () => {
    const logger = recordingLogger();
    const app = expressModule();
    app.use(idempotency({ logger }));
    app.post('/raw', (_req, res) => void res.status(201).end());
    await request(app).post('/raw').set('Idempotency-Key', 'r1').send({ a: 1 });
    await request(app).post('/raw').set('Idempotency-Key', 'r2').send({ a: 1 });
    expect(logger.lines.filter((l) => l.level === 'warn' && /body parser/.test(l.msg ?? ''))).toHaveLength(1);
  });

  test('a body express.json() skipped is not fingerprinted as {}: a warning says it was not parsed', async () => {
    const logger = recordingLogger();
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ logger }));
    app.post('/notes', expressModule.text(), (req, res) => void res.status(201).send(`got ${req.body}`));
    const unparsed = () =>
      logger.lines.filter((l) => l.level === 'warn' && /was not parsed/.test(l.msg ?? ''));
    // A JSON body is parsed: no warning.
    await request(app).post('/notes').set('Idempotency-Key', 'j').send({ a: 1 }).expect(201);
    expect(unparsed()).toHaveLength(0);
    await request(app).post('/notes').set('Idempotency-Key', 't').type('text/plain').send('one').expect(201);
    await request(app).post('/notes').set('Idempotency-Key', 't2').type('text/plain').send('two');
    expect(unparsed()).toHaveLength(1);
  });

  test('a JSON body that only a route-level express.json() parses counts as not parsed: the warning says so', async () => {
    const logger = recordingLogger();
    const app = expressModule();
    // Skips JSON; on Express 4 it still leaves req.body = {} (without its _body mark).
    app.use(expressModule.urlencoded({ extended: false }));
    app.use(idempotency({ logger, scope: false }));
    app.post('/charges', expressModule.json(), (req, res) => void res.status(201).json({ got: req.body }));
    const unparsed = () =>
      logger.lines.filter((l) => l.level === 'warn' && /was not parsed/.test(l.msg ?? ''));
    await request(app).post('/charges').set('Idempotency-Key', 'k').send({ amount: 1 }).expect(201);
    expect(unparsed()).toHaveLength(1);
  });

  test('a JSON {} parsed before oncely, or a request without a body, is no unparsed body', async () => {
    const logger = recordingLogger();
    const app = expressModule();
    app.use(expressModule.urlencoded({ extended: false }));
    app.use(expressModule.json());
    app.use(idempotency({ logger, scope: false }));
    app.post('/charges', (req, res) => void res.status(201).json({ got: req.body }));
    await request(app).post('/charges').set('Idempotency-Key', 'e').send({}).expect(201);
    await request(app).post('/charges').set('Idempotency-Key', 'n').expect(201);
    await request(app).post('/charges').set('Idempotency-Key', 'j').type('application/json').expect(201);
    expect(logger.lines.filter((l) => l.level === 'warn' && /was not parsed/.test(l.msg ?? ''))).toHaveLength(
      0,
    );
    // The parsed {} is fingerprinted as {}: the same key with another body is refused.
    await request(app).post('/charges').set('Idempotency-Key', 'e').send({ amount: 1 }).expect(422);
    const replay = await request(app).post('/charges').set('Idempotency-Key', 'e').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
  });

  test('with the text parser before oncely, a reused key with another text body gets 422', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(expressModule.text());
    app.use(idempotency());
    app.post('/notes', (req, res) => void res.status(201).send(`got ${req.body}`));
    await request(app).post('/notes').set('Idempotency-Key', 't').type('text/plain').send('one').expect(201);
    await request(app).post('/notes').set('Idempotency-Key', 't').type('text/plain').send('two').expect(422);
  });

  test('a handler that reuses its response buffer changes no stored replay', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency());
    // One buffer refilled per request, as a pool hands it out again once Node is done with it.
    const shared = Buffer.alloc(16);
    app.post('/buffer', (req, res) => {
      shared.fill(0x2e);
      shared.write(String(req.body.who));
      res.type('text/plain').end(shared);
    });
    const send = (key: string, who: string) =>
      request(app).post('/buffer').set('Idempotency-Key', key).send({ who });
    expect((await send('alice', 'alice')).text).toBe('alice...........');
    expect((await send('bob', 'bob')).text).toBe('bob.............');
    const replay = await send('alice', 'alice');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text).toBe('alice...........');
  });
});

describe('the Express middleware factory', () => {
  test('checks options once, naming the option', () => {
    expect(() => idempotency({ ttl: 'a day' as never })).toThrow(IdempotencyOptionsError);
    expect(() => idempotency({ ttl: 'a day' as never })).toThrow(/option "ttl"/);
    expect(() => idempotency({ lockTimout: '5s' } as never)).toThrow(
      /option "lockTimout" is not an oncely option/,
    );
  });

  test('exports scopeByHeader, which isolates API keys', async () => {
    const app = express();
    app.use(express.json());
    app.use(idempotency({ scope: scopeByHeader('x-api-key', { secret: 'adapter-test-secret-0123456789' }) }));
    let runs = 0;
    app.post('/charges', (_req, res) => void res.status(201).json({ run: ++runs }));
    const send = (apiKey: string) =>
      request(app).post('/charges').set('Idempotency-Key', 'same').set('x-api-key', apiKey).send({});
    await send('k1').expect(201);
    await send('k2').expect(201);
    expect((await send('k1')).headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(2);
  });

  test('returns a named middleware; the default export is the same factory', () => {
    expect(idempotency().name).toBe('idempotencyMiddleware');
    expect(idempotencyDefault).toBe(idempotency);
  });
});

describe.each(versions)('%s robustness', (_name, expressModule) => {
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  test('a handler that awaits its write callbacks is not stalled', async () => {
    const app = expressModule();
    app.use(idempotency());
    app.post('/awaits', async (_req, res) => {
      await new Promise((resolve) => res.write('a', resolve));
      await new Promise((resolve) => res.write('b', resolve));
      res.end('c');
    });
    const first = await request(app).post('/awaits').set('Idempotency-Key', 'cb-await').timeout(5000);
    expect(first.text).toBe('abc');
    const replay = await request(app).post('/awaits').set('Idempotency-Key', 'cb-await');
    expect(replay.headers['idempotent-replayed']).toBe('true');
  });

  /**
   * Runs `handler` on a bare app and on one covered by oncely (one request each, with `key`), for a comparison: each
   * run's body, the events the handler and its response's 'error' listener recorded, and its app.
   */
  const withAndWithout = async (
    key: string,
    handler: (res: import('express').Response, events: string[]) => void,
  ) => {
    const run = async (withOncely: boolean) => {
      const app = expressModule();
      if (withOncely) app.use(idempotency());
      const events: string[] = [];
      app.post('/late', (_req, res) => {
        res.on('error', (error: NodeJS.ErrnoException) => events.push(`error event ${error.code}`));
        handler(res, events);
      });
      const res = await request(app).post('/late').set('Idempotency-Key', key).expect(200);
      await sleep(50);
      return { text: res.text, events, app };
    };
    return { bare: await run(false), covered: await run(true) };
  };

  test('a write or a second end after end, while the response is held, behaves as it does without oncely', async () => {
    const { bare, covered } = await withAndWithout('late', (res, events) => {
      res.end('a');
      const returned = res.write('x', (error?: NodeJS.ErrnoException | null) =>
        events.push(`write callback ${error?.code}`),
      );
      events.push(`write returned ${returned}`);
      res.end(() => events.push('second end callback'));
    });
    expect(covered.text).toBe('a');
    // Before: write returned true, no callback and no error; the second end's callback never ran.
    expect(covered.events.filter((e) => !e.startsWith('second')).sort()).toEqual(
      bare.events.filter((e) => !e.startsWith('second')).sort(),
    );
    expect(covered.events).toContain('write callback ERR_STREAM_WRITE_AFTER_END');
    expect(covered.events).toContain('error event ERR_STREAM_WRITE_AFTER_END');
    expect(covered.events.filter((e) => e === 'second end callback')).toHaveLength(1);
    expect(bare.events).toContain('second end callback');
    const replay = await request(covered.app).post('/late').set('Idempotency-Key', 'late').expect(200);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.text).toBe('a');
  });

  test('end(chunk, cb) and write(null) after end, while the response is held, behave as they do without oncely', async () => {
    const { bare, covered } = await withAndWithout('late-chunk', (res, events) => {
      res.end('a');
      try {
        res.write(null as unknown as string);
        events.push('write(null) did not throw');
      } catch (error) {
        events.push(`write(null) threw ${(error as NodeJS.ErrnoException).code}`);
      }
      res.end('b', ((error?: NodeJS.ErrnoException | null) =>
        events.push(`end callback ${error?.code}`)) as () => void);
    });
    expect(bare.events.sort()).toEqual([
      'end callback ERR_STREAM_WRITE_AFTER_END',
      'error event ERR_STREAM_WRITE_AFTER_END',
      'write(null) threw ERR_STREAM_NULL_VALUES',
    ]);
    expect({ text: covered.text, events: covered.events.sort() }).toEqual({
      text: bare.text,
      events: bare.events,
    });
  });

  test('a response sent by someone else while the store was asked: no crash, no execution, key freed', async () => {
    const { slow, release } = gatedStore();
    const app = expressModule();
    // A timeout middleware answering first, as connect-timeout would.
    app.use((_req, res, next) => {
      setTimeout(() => {
        if (!res.headersSent) res.status(503).json({ error: 'timeout' });
        release();
      }, 50);
      next();
    });
    app.use(idempotency({ store: slow }));
    let runs = 0;
    app.post('/slow-store', (_req, res) => void res.status(201).json({ run: ++runs }));
    const res = await request(app).post('/slow-store').set('Idempotency-Key', 'sent-early');
    expect(res.status).toBe(503);
    await sleep(50);
    expect(runs).toBe(0);
    // The key was freed: the next request runs.
    const ok = await request(app).post('/slow-store').set('Idempotency-Key', 'sent-early');
    expect(ok.status).toBe(201);
    expect(runs).toBe(1);
  });

  test('code running after the answer cannot change what the client gets or what is stored', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency());
    app.post('/late', (_req, res) => {
      res.status(201).json({ id: 1 });
      // A late change, as an error handler checking headersSent would make while the store is asked.
      res.status(500);
      res.setHeader('x-late', 'yes');
    });
    const first = await request(app).post('/late').set('Idempotency-Key', 'late').send({});
    expect(first.status).toBe(201);
    expect(first.headers['x-late']).toBeUndefined();
    expect(first.body).toEqual({ id: 1 });
    const replay = await request(app).post('/late').set('Idempotency-Key', 'late').send({});
    expect(replay.status).toBe(201);
  });

  test('a streamed response over maxBodyBytes that then fails releases its key', async () => {
    const app = expressModule();
    app.use(idempotency({ maxBodyBytes: 100, lockTimeout: 300 }));
    let runs = 0;
    app.post('/export', (_req, res, next) => {
      runs++;
      res.write('x'.repeat(500)); // over the limit: streaming has begun
      setImmediate(() => next(new Error('cursor died')));
    });
    app.use((err: Error, _req: express.Request, res: express.Response, next: express.NextFunction) => {
      if (res.headersSent) return next(err); // Express then destroys the socket
      res.status(500).end();
    });
    await request(app)
      .post('/export')
      .set('Idempotency-Key', 'export')
      .catch(() => undefined);
    // Released, not kept locked by renewals: a retry runs again (well before any lease could run out).
    let retried = false;
    for (let i = 0; i < 20 && !retried; i++) {
      await sleep(25);
      const res = await request(app)
        .post('/export')
        .set('Idempotency-Key', 'export')
        .catch(() => undefined);
      retried = runs === 2 || res?.status === 409 ? runs === 2 : false;
    }
    expect(runs).toBe(2);
  });

  test('a mounted sub-app: covered, replayed, and its handlers see req.idempotencyKey', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency());
    const sub = expressModule();
    let runs = 0;
    sub.post('/charges', (req, res) => {
      runs++;
      res.status(201).json({ key: req.idempotencyKey, context: req.idempotency?.key });
    });
    app.use('/sub', sub);
    const first = await request(app).post('/sub/charges').set('Idempotency-Key', 'sub-1').send({});
    expect(first.status).toBe(201);
    expect(first.body).toEqual({ key: 'sub-1', context: 'sub-1' });
    const replay = await request(app).post('/sub/charges').set('Idempotency-Key', 'sub-1').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual(first.body);
    // A sub-app that has no such route: the app's 404 is what the key recorded.
    const missing = await request(app).post('/sub/nothing').set('Idempotency-Key', 'sub-2').send({});
    expect(missing.status).toBe(404);
    const again = await request(app).post('/sub/nothing').set('Idempotency-Key', 'sub-2').send({});
    expect(again.status).toBe(404);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
  });

  test('requests oncely does not cover keep no idempotency properties, and a handler may assign them', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency());
    app.get(
      '/read',
      (req, res) =>
        void res.json({ key: req.idempotencyKey ?? null, own: Object.hasOwn(req, 'idempotency') }),
    );
    app.post('/assign', (req, res) => {
      req.idempotencyKey = 'mine';
      res.status(201).json({ key: req.idempotencyKey });
    });
    await request(app).post('/assign').set('Idempotency-Key', 'a1').send({}).expect(201, { key: 'mine' });
    const read = await request(app).get('/read').set('Idempotency-Key', 'a1');
    expect(read.body).toEqual({ key: null, own: false });
  });

  test('only a covered request and its response carry what oncely adds, and the key reads', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency());
    const seen: unknown[] = [];
    const look = (req: express.Request, res: express.Response) => ({
      key: req.idempotencyKey,
      context: req.idempotency?.key,
      own: ['idempotencyKey', 'idempotency'].filter((name) => Object.hasOwn(req, name)),
      ownMethods: ['write', 'end', 'writeHead'].filter((name) => Object.hasOwn(res, name)),
    });
    app.post('/plain', (req, res) => {
      seen.push(look(req, res));
      res.status(201).json({ ok: true });
    });
    app.get('/plain', (req, res) => {
      seen.push(look(req, res));
      res.json({ ok: true });
    });
    await request(app).post('/plain').set('Idempotency-Key', 'p1').send({}).expect(201);
    const replay = await request(app).post('/plain').set('Idempotency-Key', 'p1').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    await request(app).get('/plain').set('Idempotency-Key', 'p1').expect(200);
    expect(seen).toEqual([
      {
        key: 'p1',
        context: 'p1',
        own: ['idempotencyKey', 'idempotency'],
        ownMethods: ['write', 'end', 'writeHead'],
      },
      { key: undefined, context: undefined, own: [], ownMethods: [] },
    ]);
    // Nothing of Node's changed.
    for (const name of ['write', 'end', 'writeHead'] as const)
      expect(ServerResponse.prototype[name]).toBe(pristine[name]);
    expect(Object.getOwnPropertyNames(IncomingMessage.prototype)).not.toContain('idempotencyKey');
    expect(Object.getOwnPropertySymbols(ServerResponse.prototype)).toEqual([]);
    // Nor the router's: its Layer's request method is the one the router defines.
    const router =
      (app as unknown as { _router?: { stack: object[] }; router?: { stack: object[] } })._router ??
      (app as unknown as { router: { stack: object[] } }).router;
    const layer = Object.getPrototypeOf(router.stack[0]) as Record<string, unknown>;
    const method = 'handleRequest' in layer ? 'handleRequest' : 'handle_request';
    expect(Object.getOwnPropertySymbols(layer)).toEqual([]);
    expect(String(layer[method])).not.toMatch(/oncely|state/);
    expect(Object.keys(layer).filter((name) => /oncely/i.test(name))).toEqual([]);
  });

  test('a middleware before oncely that wrapped res.end on the response: oncely wraps it in turn and stores the bytes', async () => {
    const app = expressModule();
    app.use((_req, res, next) => {
      const end = res.end;
      // Marks what goes on the wire, after oncely: the stored body must not carry the mark.
      res.end = function marked(this: typeof res, ...args: unknown[]) {
        res.setHeader('x-marked', 'yes');
        return (end as (...a: unknown[]) => typeof res).apply(this, args);
      } as typeof res.end;
      next();
    });
    app.use(expressModule.json());
    app.use(idempotency());
    let runs = 0;
    app.post('/wrapped', (_req, res) => {
      runs++;
      res.status(201).send('body');
    });
    const first = await request(app).post('/wrapped').set('Idempotency-Key', 'w1').send({});
    expect(first.status).toBe(201);
    expect(first.headers['x-marked']).toBe('yes');
    const replay = await request(app).post('/wrapped').set('Idempotency-Key', 'w1').send({});
    expect(replay.text).toBe('body');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
  });

  test('compression mounted before: what the handler wrote is stored, each client gets what it accepts', async () => {
    const app = expressModule();
    app.use(compression({ threshold: 0 }));
    app.use(expressModule.json());
    app.use(idempotency());
    let runs = 0;
    const text = 'a compressible body '.repeat(20);
    app.post('/zip', (_req, res) => {
      runs++;
      res.status(201).type('text/plain').send(text);
    });
    const gzip = await request(app).post('/zip').set('Idempotency-Key', 'z1').set('Accept-Encoding', 'gzip');
    expect(gzip.status).toBe(201);
    expect(gzip.headers['content-encoding']).toBe('gzip');
    expect(gzip.text).toBe(text); // superagent inflates it
    const plain = await request(app)
      .post('/zip')
      .set('Idempotency-Key', 'z1')
      .set('Accept-Encoding', 'identity');
    expect(plain.headers['idempotent-replayed']).toBe('true');
    expect(plain.headers['content-encoding']).toBeUndefined();
    expect(plain.text).toBe(text);
    expect(runs).toBe(1);
  });

  test('morgan mounted before (it wraps writeHead): covered, replayed, and every response logged', async () => {
    const lines: string[] = [];
    const app = expressModule();
    app.use(
      morgan(':method :url :status', { stream: { write: (line: string) => void lines.push(line.trim()) } }),
    );
    app.use(expressModule.json());
    app.use(idempotency());
    let runs = 0;
    app.post('/logged', (_req, res) => void res.status(201).json({ run: ++runs }));
    await request(app).post('/logged').set('Idempotency-Key', 'm1').send({}).expect(201);
    const replay = await request(app).post('/logged').set('Idempotency-Key', 'm1').send({});
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ run: 1 });
    await sleep(20);
    expect(lines).toEqual(['POST /logged 201', 'POST /logged 201']);
  });

  test.each([
    ['writeHead then end', ['writeHead', 'end']],
    ['end alone (Node sends the head itself)', ['end']],
    ['after a held write', ['write', 'end']],
  ])(
    "a response sent around oncely (Node's own methods, %s) is recorded as executed: never run again, never locked",
    async (_label, calls) => {
      const app = expressModule();
      app.use(idempotency({ lockTimeout: 60_000 }));
      let runs = 0;
      app.post('/around', (_req, res) => {
        runs++;
        // Node's own methods, called on the response directly: they bypass what oncely wrapped on it.
        if (calls.includes('write')) res.write('held ');
        if (calls.includes('writeHead')) ServerResponse.prototype.writeHead.call(res, 200);
        (ServerResponse.prototype.end as (this: ServerResponse, chunk: string) => void).call(res, 'raw');
      });
      const first = await request(app).post('/around').set('Idempotency-Key', 'r1');
      expect(first.status).toBe(200);
      expect(first.text).toBe(calls.includes('write') ? 'held raw' : 'raw');
      await sleep(20);
      const retry = await request(app).post('/around').set('Idempotency-Key', 'r1');
      expect(retry.status).toBe(410);
      expect(runs).toBe(1);
    },
  );

  test('res.flushHeaders() sends the head at once: streamed as it comes, recorded as executed', async () => {
    const app = expressModule();
    app.use(idempotency({ lockTimeout: 60_000 }));
    let runs = 0;
    app.post('/flushed', (_req, res) => {
      runs++;
      res.status(202).type('text/plain');
      res.flushHeaders();
      res.write('a');
      res.end('b');
    });
    const first = await request(app).post('/flushed').set('Idempotency-Key', 'f1');
    expect(first.status).toBe(202);
    expect(first.text).toBe('ab');
    await sleep(20);
    const retry = await request(app).post('/flushed').set('Idempotency-Key', 'f1');
    expect(retry.status).toBe(410);
    expect(runs).toBe(1);
  });

  test('a client gone (socket destroyed) and answered while the store was asked: the handler does not run', async () => {
    const { memory, slow, release, asked } = gatedStore();
    const app = expressModule();
    // In this order, each step once the one before it happened: the store asked, the client gone, the request
    // answered from elsewhere, the store's answer.
    app.use((req, res, next) => {
      void asked.then(() => req.socket.destroy());
      req.socket.once('close', () => {
        // On a destroyed socket this ends the response without sending headers: headersSent stays false.
        if (!res.headersSent) res.status(503).json({ error: 'timeout' });
        release();
      });
      next();
    });
    const { store, settled } = settling(slow, memory, 'gone');
    app.use(idempotency({ store }));
    let runs = 0;
    app.post('/gone', (_req, res) => void res.status(201).json({ run: ++runs }));
    await request(app)
      .post('/gone')
      .set('Idempotency-Key', 'gone')
      .catch(() => undefined);
    await settled();
    expect(runs).toBe(0);
    expect(await memory.get('gone')).toBeUndefined();
  });

  test('a client gone (socket destroyed) while the store was asked, nothing answered: the handler does not run, the key is free', async () => {
    const { memory, slow, release, asked } = gatedStore();
    const app = expressModule();
    // The store answers only once the client it was asked for is gone.
    app.use((req, _res, next) => {
      void asked.then(() => req.socket.destroy());
      req.socket.once('close', release);
      next();
    });
    const { store, settled } = settling(slow, memory, 'left');
    app.use(idempotency({ store, lockTimeout: 60_000 }));
    let runs = 0;
    app.post('/left', (_req, res) => void res.status(201).json({ run: ++runs }));
    await request(app)
      .post('/left')
      .set('Idempotency-Key', 'left')
      .catch(() => undefined);
    await settled();
    expect(runs).toBe(0);
    // Released, not held until the lease runs out (a retry would get 409 for a minute).
    expect(await memory.get('left')).toBeUndefined();
  });

  test('a handler in an app of another Express copy, called as a function: captured and replayed', async () => {
    // A fresh copy of the other Express, as a duplicated dependency would load: nothing oncely did to the copies
    // other tests used applies to it.
    let other!: typeof express;
    jest.isolateModules(() => {
      other = require(expressModule === express ? 'express4' : 'express') as typeof express;
    });
    const outer = expressModule();
    outer.use(expressModule.json());
    outer.use(idempotency());
    const inner = other();
    let runs = 0;
    const keys: unknown[] = [];
    inner.post('/charges', (req, res) => {
      keys.push(req.idempotencyKey);
      res.status(201).json({ run: ++runs });
    });
    outer.use('/v1', (req, res, next) => inner(req, res, next));
    const first = await request(outer).post('/v1/charges').set('Idempotency-Key', 'mix').send({});
    expect(first.status).toBe(201);
    const replay = await request(outer).post('/v1/charges').set('Idempotency-Key', 'mix').send({});
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ run: 1 });
    expect(keys).toEqual(['mix']);
  });
});

describe.each(versions)('%s beside other code in the process', (_name, expressModule) => {
  test('a patch put on OutgoingMessage.prototype after oncely installed still runs for every response', async () => {
    const seen: string[] = [];
    const previous = OutgoingMessage.prototype.end;
    // As an APM or a test library does, after the app was built.
    OutgoingMessage.prototype.end = function (this: OutgoingMessage, ...args: unknown[]) {
      if (this instanceof ServerResponse) seen.push(this.req.url ?? '');
      return (previous as (...a: unknown[]) => unknown).apply(this, args);
    } as typeof previous;
    try {
      const covered = expressModule();
      covered.use(expressModule.json());
      covered.use(idempotency());
      covered.post('/covered', (_req, res) => void res.status(201).json({ ok: true }));
      const plain = expressModule();
      plain.get('/plain', (_req, res) => void res.send('plain'));
      const server = createServer((_req, res) => res.end('node'));
      await request(covered).post('/covered').set('Idempotency-Key', 'apm-1').send({}).expect(201);
      const replay = await request(covered).post('/covered').set('Idempotency-Key', 'apm-1').send({});
      expect(replay.headers['idempotent-replayed']).toBe('true');
      await request(plain).get('/plain').expect(200, 'plain');
      await request(server).get('/node').expect(200, 'node');
      expect(seen).toEqual(['/covered', '/covered', '/plain', '/node']);
    } finally {
      OutgoingMessage.prototype.end = previous;
    }
  });

  test("a value on the app's request prototype does not hide the key from the handler", async () => {
    const app = expressModule();
    (app.request as unknown as Record<string, unknown>).idempotencyKey = undefined;
    app.use(expressModule.json());
    app.use(idempotency());
    const keys: unknown[] = [];
    app.post('/shadowed', (req, res) => {
      keys.push(req.idempotencyKey, req.idempotency?.key);
      res.status(201).json({ ok: true });
    });
    await request(app).post('/shadowed').set('Idempotency-Key', 's9').send({}).expect(201);
    expect(keys).toEqual(['s9', 's9']);
  });

  test('a Router mounted on a plain http server, without an app: covered and replayed', async () => {
    const router = expressModule.Router();
    router.use(expressModule.json());
    router.use(idempotency());
    let runs = 0;
    // No app, so no Express helpers on req and res: Node's own methods.
    router.post('/charges', (_req, res) => {
      res.statusCode = 201;
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ run: ++runs }));
    });
    const server = createServer((req, res) =>
      router(req as express.Request, res as express.Response, (error?: unknown) => {
        res.statusCode = error === undefined ? 404 : 500;
        res.end(String(error instanceof Error ? error.stack : error));
      }),
    );
    const first = await request(server).post('/charges').set('Idempotency-Key', 'r1').send({});
    expect(first.status).toBe(201);
    expect(first.body).toEqual({ run: 1 });
    const replay = await request(server).post('/charges').set('Idempotency-Key', 'r1').send({});
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
  });

  test('a request another version of this package holds is left to it; its key still reads', async () => {
    // What a copy of another shape leaves on a response it covers: a mark this version must not use.
    const app = expressModule();
    app.use(expressModule.json());
    app.use((req, res, next) => {
      (res as unknown as Record<symbol, unknown>)[Symbol.for('oncely.express.held')] = {
        protocol: 1,
        capture: { shape: 'unknown' },
      };
      req.idempotencyKey = 'held-elsewhere';
      next();
    });
    app.use(idempotency());
    let runs = 0;
    app.post('/elsewhere', (req, res) => {
      runs++;
      res.status(201).json({ key: req.idempotencyKey });
    });
    for (let i = 0; i < 2; i++) {
      await request(app)
        .post('/elsewhere')
        .set('Idempotency-Key', 'v1')
        .send({})
        .expect(201, { key: 'held-elsewhere' });
    }
    expect(runs).toBe(2);
  });
});

describe('wiring mistakes without a logger: a process warning, once per kind', () => {
  const warningsOf = (emitWarning: jest.SpyInstance, code: string): string[] =>
    emitWarning.mock.calls
      .filter((call) => (call[1] as { code?: string } | undefined)?.code === code)
      .map((call) => String(call[0]));

  test('oncely mounted before the body parser', async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    try {
      const app = express();
      app.use(idempotency({ store: new MemoryStore() }));
      app.use(express.json());
      let runs = 0;
      app.post('/orders', (_req, res) => void res.status(201).json({ run: ++runs }));
      await request(app).post('/orders').set('Idempotency-Key', 'b1').send({ amount: 1 }).expect(201);
      // The trap the warning names: the fingerprint never saw the body, so another body is replayed, not refused.
      const other = await request(app).post('/orders').set('Idempotency-Key', 'b1').send({ amount: 2 });
      expect(other.headers['idempotent-replayed']).toBe('true');
      await request(app).post('/orders').set('Idempotency-Key', 'b2').send({ amount: 3 }).expect(201);
      const said = warningsOf(emitWarning, 'ONCELY_BODY_NOT_PARSED');
      expect(said).toHaveLength(1);
      expect(said[0]).toMatch(/mount express\.json\(\).*before idempotency\(\)/);
    } finally {
      emitWarning.mockRestore();
    }
  });

  test('a store outage answered 503 is said once, with the store error; with a logger, each time', async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    try {
      const app = express();
      app.use(express.json());
      app.use(idempotency({ store: brokenStore() }));
      app.post('/orders', (_req, res) => void res.status(201).end());
      for (const key of ['s1', 's2', 's3'])
        await request(app).post('/orders').set('Idempotency-Key', key).send({}).expect(503);
      const said = warningsOf(emitWarning, 'ONCELY_STORE_UNAVAILABLE');
      expect(said).toHaveLength(1);
      expect(said[0]).toMatch(/answering 503.*ECONNREFUSED/);

      const logger = recordingLogger();
      const logged = express();
      logged.use(express.json());
      logged.use(idempotency({ store: brokenStore(), logger }));
      logged.post('/orders', (_req, res) => void res.status(201).end());
      for (const key of ['s1', 's2'])
        await request(logged).post('/orders').set('Idempotency-Key', key).send({}).expect(503);
      expect(
        logger.lines.filter((l) => l.level === 'error' && /answering 503/.test(l.msg ?? '')),
      ).toHaveLength(2);
      expect(warningsOf(emitWarning, 'ONCELY_STORE_UNAVAILABLE')).toHaveLength(1);
    } finally {
      emitWarning.mockRestore();
    }
  });

  test('a hook that throws', async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    try {
      const app = express();
      app.use(express.json());
      app.use(
        idempotency({
          hooks: {
            onMiss: () => {
              throw new Error('metrics client not started');
            },
          },
        }),
      );
      app.post('/orders', (_req, res) => void res.status(201).end());
      for (const key of ['h1', 'h2'])
        await request(app).post('/orders').set('Idempotency-Key', key).send({}).expect(201);
      const said = warningsOf(emitWarning, 'ONCELY_HOOK_THREW');
      expect(said).toHaveLength(1);
      expect(said[0]).toMatch(/onMiss hook threw \(metrics client not started\)/);
    } finally {
      emitWarning.mockRestore();
    }
  });
});
