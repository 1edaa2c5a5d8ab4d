import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { IdempotencyOptionsError, MemoryStore, OncelyError } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { expectLeavingClientReleased, fetchHandlerClient } from '@oncely/testing';
import express from 'express';
import request from 'supertest';
import { idempotencyOf, scopeByHeader, withIdempotency } from '../src';

const post = (
  path: string,
  key: string | undefined,
  body: string | ReadableStream<Uint8Array> | null = '{}',
  headers = {},
) =>
  new Request(`http://localhost${path}`, {
    method: 'POST',
    body,
    headers: {
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
      ...headers,
    },
    ...(body instanceof ReadableStream ? { duplex: 'half' } : {}),
  } as RequestInit);

describe('@oncely/web specifics', () => {
  // A client that leaves is one whose request's signal aborted; over @hono/node-server, the suite's (http.test.ts).
  test('a client that leaves while the store is asked: answered 499 (to no one), handled as one that left', () =>
    expectLeavingClientReleased(async (options) => {
      let runs = 0;
      const handler = withIdempotency(async () => Response.json({ run: ++runs }, { status: 201 }), options);
      return fetchHandlerClient(handler, 'http://localhost/r', () => runs);
    }));

  test('extra arguments (env, ctx, a route context) reach the handler unchanged', async () => {
    const seen: unknown[] = [];
    const handler = withIdempotency(async (_request: Request, env: { name: string }, ctx: number) => {
      seen.push(env, ctx);
      return Response.json({ ok: true }, { status: 201 });
    });
    const env = { name: 'env' };
    await handler(post('/a', 'k1'), env, 7);
    const replay = await handler(post('/a', 'k1'), env, 7);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(seen).toEqual([env, 7]);
  });

  test('the handler reads the body itself after oncely read a copy, and reads its context', async () => {
    const handler = withIdempotency(async (request) =>
      Response.json({ body: await request.json(), context: idempotencyOf(request) }),
    );
    const res = await handler(post('/a', '"quoted-key"', '{"amount":5}'));
    expect(await res.json()).toEqual({ body: { amount: 5 }, context: { key: 'quoted-key' } });
  });

  test('a handler that returns something else than a Response throws, and the key is released', async () => {
    let runs = 0;
    const handler = withIdempotency((async () => {
      runs++;
      return { status: 200 };
    }) as unknown as (request: Request) => Promise<Response>);
    await expect(handler(post('/a', 'bad'))).rejects.toThrow(/must return a Response/);
    await expect(handler(post('/a', 'bad'))).rejects.toThrow(OncelyError);
    expect(runs).toBe(2);
    expect(() => withIdempotency('not a handler' as never)).toThrow(OncelyError);
  });

  test('a request body that fails while oncely reads it: 400 body-unreadable, handler not run', async () => {
    let runs = 0;
    const handler = withIdempotency(async () => {
      runs++;
      return new Response('ok');
    });
    const broken = new ReadableStream<Uint8Array>({
      pull(controller) {
        controller.error(new Error('connection reset'));
      },
    });
    const res = await handler(post('/a', 'broken', broken));
    expect(res.status).toBe(400);
    expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(((await res.json()) as { type: string }).type).toBe('https://oncely.dev/problems/body-unreadable');
    expect(runs).toBe(0);
  });

  test('a client that stops reading a body too large to keep: recorded as executed, the retry gets 410', async () => {
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        let sent = 0;
        return new Response(
          new ReadableStream<Uint8Array>({
            pull(controller) {
              if (sent++ === 100) controller.close();
              else controller.enqueue(new Uint8Array(1000));
            },
          }),
        );
      },
      { maxBodyBytes: 2000 },
    );
    const first = await handler(post('/a', 'big'));
    const reader = (first.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    await reader.cancel('client went away');
    await new Promise((resolve) => setTimeout(resolve, 20));
    const retry = await handler(post('/a', 'big'));
    expect(retry.status).toBe(410);
    expect(runs).toBe(1);
  });

  test('a large streamed response dropped unread: once its body is collected the key is recorded as executed, not leased for ever', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        return new Response(
          new ReadableStream<Uint8Array>({
            pull(controller) {
              controller.enqueue(new Uint8Array(1000));
            },
          }),
        );
      },
      // A lease renewed while the body is held: a retry would get 409 for as long as it is. Long enough that a
      // starved event loop (CI's busy cores) cannot let it lapse between renewals, which would answer 200.
      { maxBodyBytes: 100, lockTimeout: 5000 },
    );
    // In a function of its own, so that nothing here keeps the response reachable.
    const dropUnread = async () => {
      const first = await handler(post('/a', 'dropped'));
      expect(first.status).toBe(200);
    };
    await dropUnread();
    let status = 0;
    for (let i = 0; i < 50 && status !== 410; i++) {
      gc();
      await new Promise((resolve) => setTimeout(resolve, 20));
      status = (await handler(post('/a', 'dropped'))).status;
    }
    expect(status).toBe(410);
    expect(runs).toBe(1);
  });

  test('a record made by the Express adapter replays for the same JSON request here (one fingerprint)', async () => {
    const store = new MemoryStore();
    const app = express();
    let runs = 0;
    app.use(express.json());
    app.use(idempotency({ store }));
    app.post('/charges', (_req, res) => void res.status(201).json({ run: ++runs }));
    await request(app).post('/charges').set('Idempotency-Key', 'shared').send({ b: 2, a: 1 }).expect(201);
    const handler = withIdempotency(async () => Response.json({ run: ++runs }, { status: 201 }), { store });
    const replay = await handler(post('/charges', 'shared', '{ "a": 1, "b": 2 }'));
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.json()).toEqual({ run: 1 });
    const other = await handler(post('/charges', 'shared', '{"a":1,"b":3}'));
    expect(other.status).toBe(422);
    expect(runs).toBe(1);
  });

  test('wrapped twice with the Request rebuilt in between (a router): the same key is one request (refused on a conflict, else the outer one’s), another key an operation of its own', async () => {
    let runs = 0;
    const perUser = withIdempotency(
      async (request: Request) => Response.json({ user: request.headers.get('x-user'), run: ++runs }),
      { scope: (request) => `user:${request.headers.get('x-user')}` },
    );
    const rebuilt = withIdempotency((request: Request) => perUser(new Request(request)), { scope: false });
    // Later, after a tick: the outer registration's run is still the async context the inner one meets.
    const later = withIdempotency(
      async (request: Request) => {
        await new Promise((resolve) => setTimeout(resolve, 5));
        return perUser(new Request(request.url, { method: 'POST', body: '{}', headers: request.headers }));
      },
      { scope: false },
    );
    for (const outer of [rebuilt, later]) {
      for (const user of ['alice', 'bob']) {
        const res = await outer(post('/charges', `same-${runs}-${user}`, '{}', { 'x-user': user }));
        expect(res.status).toBe(500);
        expect(res.headers.get('idempotent-replayed')).toBeNull();
        expect(((await res.json()) as { type: string }).type).toBe(
          'https://oncely.dev/problems/conflicting-registrations',
        );
      }
    }
    expect(runs).toBe(0);
    // The outer handler sends on a request with another key: an operation of its own, under the inner's options.
    const composed = withIdempotency(
      (request: Request) =>
        perUser(
          new Request(request, {
            headers: {
              'idempotency-key': `sub-${request.headers.get('idempotency-key')}`,
              'x-user': 'alice',
            },
          }),
        ),
      { scope: false },
    );
    const first = await composed(post('/orders', 'k', '{}', { 'x-user': 'alice' }));
    expect(first.status).toBe(200);
    expect(await first.json()).toEqual({ user: 'alice', run: 1 });
    const again = await composed(post('/orders', 'k', '{}', { 'x-user': 'alice' }));
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(1);
    // Options that agree: the outer one handles the rebuilt request, and the inner handler reads its key.
    let seen: string | undefined;
    const inner = withIdempotency(
      async (request: Request) => {
        seen = idempotencyOf(request)?.key;
        return Response.json({ run: ++runs }, { status: 201 });
      },
      { required: true },
    );
    const agreeing = withIdempotency((request: Request) => inner(new Request(request)));
    const made = await agreeing(post('/agree', 'agreed', '{}'));
    expect(made.status).toBe(201);
    expect(seen).toBe('agreed');
    expect((await agreeing(post('/agree', 'agreed', '{}'))).headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(2);
  });

  test('options are checked once, at wrap time, naming the option', () => {
    expect(() => withIdempotency(async () => new Response(), { ttl: 'soon' as never })).toThrow(
      IdempotencyOptionsError,
    );
    expect(() => withIdempotency(undefined as never)).toThrow(/fetch handler/);
  });
});

test('@oncely/web exports scopeByHeader, which isolates API keys', async () => {
  let runs = 0;
  const handler = withIdempotency(async () => Response.json({ run: ++runs }, { status: 201 }), {
    scope: scopeByHeader('x-api-key', { secret: 'adapter-test-secret-0123456789' }),
  });
  const send = (apiKey: string) => handler(post('/charges', 'same', '{}', { 'x-api-key': apiKey }));
  expect((await send('k1')).status).toBe(201);
  expect((await send('k2')).status).toBe(201);
  expect((await send('k1')).headers.get('idempotent-replayed')).toBe('true');
  expect(runs).toBe(2);
});
