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
