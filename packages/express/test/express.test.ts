import { Readable } from 'node:stream';
import { IdempotencyOptionsError, MemoryStore } from '@oncely/core';
import { recordingLogger } from '@oncely/testing';
import express from 'express';
import express4 from 'express4';
import request from 'supertest';
import idempotencyDefault, { idempotency } from '../src';

const versions = [
  ['Express 5', express],
  ['Express 4', express4 as unknown as typeof express],
] as const;

describe.each(versions)('%s specifics', (_name, expressModule) => {
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
});

describe('the Express middleware factory', () => {
  test('checks options once, naming the option', () => {
    expect(() => idempotency({ ttl: 'a day' })).toThrow(IdempotencyOptionsError);
    expect(() => idempotency({ ttl: 'a day' })).toThrow(/option "ttl"/);
    expect(() => idempotency({ lockTimout: '5s' } as never)).toThrow(
      /option "lockTimout" is not an oncely option/,
    );
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

  test('a response sent by someone else while the store was asked: no crash, no execution, key freed', async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const memory = new MemoryStore();
    const slow = {
      acquire: async (...args: Parameters<MemoryStore['acquire']>) => {
        await gate;
        return memory.acquire(...args);
      },
      complete: memory.complete.bind(memory),
      release: memory.release.bind(memory),
      renew: memory.renew.bind(memory),
    };
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
});
