import { createServer, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { MemoryStore } from '@oncely/core';
import express from 'express';
import express4 from 'express4';
import request from 'supertest';
import { idempotency } from '../src';

const versions = [
  ['Express 5', express],
  ['Express 4', express4 as unknown as typeof express],
] as const;

/**
 * Sends `first`, then, unless the server closed the connection within 3 s of it (every answer here should close it;
 * on a loaded machine that may take a while), `second` on the same keep-alive connection; returns every byte the
 * server sent (Date headers blanked) and whether it closed the connection.
 */
function onOneConnection(
  server: Server,
  first: string,
  second: string,
): Promise<{ raw: string; closed: boolean }> {
  const { port } = server.address() as AddressInfo;
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    let raw = '';
    let closed = false;
    const finish = () => {
      socket.destroy();
      resolve({ raw: raw.replace(/^Date: .*\r\n/gim, ''), closed });
    };
    const trySecond = setTimeout(() => {
      socket.write(second);
      setTimeout(finish, 500);
    }, 3000);
    socket.on('data', (data) => {
      raw += data.toString('latin1');
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      closed = true;
      clearTimeout(trySecond);
      finish();
    });
    socket.write(first);
  });
}

function post(key: string | undefined, path = '/write-then-fail'): string {
  return [
    `POST ${path} HTTP/1.1`,
    'Host: x',
    'Connection: keep-alive',
    'Content-Type: application/json',
    'Content-Length: 2',
    ...(key === undefined ? [] : [`Idempotency-Key: ${key}`]),
    '',
    '{}',
  ].join('\r\n');
}
const ping = 'GET /ping HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n';

describe.each(versions)('%s: a body written with res.write, then an error', (_name, expressModule) => {
  const servers: Server[] = [];
  afterAll(() => Promise.all(servers.map((s) => new Promise((r) => s.close(r)))));

  function serve(app: express.Express): Promise<Server> {
    const server = createServer(app);
    servers.push(server);
    return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
  }

  function app(
    covered: boolean,
    errorStatus: number | undefined,
  ): { app: express.Express; runs: () => number } {
    const app = expressModule();
    app.use(expressModule.json());
    if (covered) app.use(idempotency({ store: new MemoryStore() }));
    let runs = 0;
    app.get('/ping', (_req, res) => void res.send('pong'));
    app.post('/write-then-fail', (_req, res) => {
      runs++;
      res.write('SMUGGLED-');
      throw new Error('failed after writing');
    });
    if (errorStatus !== undefined)
      app.use(
        (_error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) =>
          void res.status(errorStatus).json({ e: 1 }),
      );
    return { app, runs: () => runs };
  }

  test.each([500, 409, undefined])(
    'the error answer (%s) sends what Express sends without oncely, closes the connection and frees the key',
    async (errorStatus) => {
      const plain = await serve(app(false, errorStatus).app);
      const expected = await onOneConnection(plain, post(undefined), ping);
      expect(expected.closed).toBe(true);
      expect(expected.raw).toContain('SMUGGLED-');
      expect(expected.raw).not.toContain('pong');

      const covered = app(true, errorStatus);
      const server = await serve(covered.app);
      const got = await onOneConnection(server, post('k1'), ping);
      expect(got.closed).toBe(true);
      expect(got.raw).not.toContain('pong');
      expect(got.raw).not.toContain('{"e":1}');
      // With an error handler of its own the held bytes go out as they did without oncely; Express's default one
      // closes the connection at once, before they could.
      if (errorStatus !== undefined) expect(got.raw).toBe(expected.raw);
      expect(covered.runs()).toBe(1);

      // The key was released: the retry runs the handler again.
      await onOneConnection(server, post('k1'), ping);
      expect(covered.runs()).toBe(2);
    },
  );
});

describe.each(versions)('%s: a response whose head was flushed', (_name, expressModule) => {
  function app(): { app: express.Express; runs: () => number } {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ store: new MemoryStore() }));
    let runs = 0;
    app.post('/flushed', (req, res) => {
      runs++;
      res.flushHeaders();
      res.write('x');
      if (req.body.fail) setTimeout(() => res.destroy(new Error('the stream failed')), 20);
      else setTimeout(() => res.end('y'), 20);
    });
    return { app, runs: () => runs };
  }
  const attempt = (target: express.Express, body: object) =>
    request(target)
      .post('/flushed')
      .set('Idempotency-Key', 'k1')
      .send(body)
      .then(
        (res) => res.status,
        () => 'closed',
      );

  test('a body that fails after the head was flushed releases the key: the retry runs again', async () => {
    const { app: target, runs } = app();
    expect(await attempt(target, { fail: true })).toBe('closed');
    expect(await attempt(target, { fail: true })).toBe('closed');
    expect(runs()).toBe(2);
  });

  test('one that finishes is recorded as executed: the retry gets a 410 and never runs it again', async () => {
    const { app: target, runs } = app();
    expect(await attempt(target, {})).toBe(200);
    expect(await attempt(target, {})).toBe(410);
    expect(runs()).toBe(1);
  });
});

describe.each(versions)('%s: writeHead with a raw header list', (_name, expressModule) => {
  test.each([
    ['flat', ['Set-Cookie', 'a=1', 'X-A', '1', 'Set-Cookie', 'b=2', 'X-A', '2']],
    [
      'nested',
      [
        ['Set-Cookie', 'a=1'],
        ['X-A', '1'],
        ['Set-Cookie', 'b=2'],
        ['X-A', '2'],
      ],
    ],
  ])(
    'a name given twice (%s) is sent with both values, and a stored one replayed with both',
    async (_form, raw) => {
      const app = expressModule();
      app.use(expressModule.json());
      app.use(idempotency({ store: new MemoryStore() }));
      let runs = 0;
      app.post('/raw', (_req, res) => {
        runs++;
        res.setHeader('x-a', 'set before');
        res.writeHead(201, raw as string[]).end('ok');
      });
      const first = await request(app).post('/raw').set('Idempotency-Key', 'k1').send({});
      expect(first.status).toBe(201);
      expect(first.headers['set-cookie']).toEqual(['a=1', 'b=2']);
      expect(first.headers['x-a']).toBe('1, 2');
      const replay = await request(app).post('/raw').set('Idempotency-Key', 'k1').send({});
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['x-a']).toBe('1, 2');
      expect(replay.headers['set-cookie']).toBeUndefined();
      expect(runs).toBe(1);
    },
  );
});
