import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { currentIdempotency, type IdempotencyContext, MemoryStore } from '@oncely/core';
import express from 'express';
import express4 from 'express4';
import request from 'supertest';
import { idempotency } from '../src';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const versions = [
  ['Express 5', express],
  ['Express 4', express4 as unknown as typeof express],
] as const;

describe.each(versions)('%s: steps', (_name, expressModule) => {
  test('a step recorded before a 500 is replayed on the retry; currentIdempotency() after awaits is req.idempotency', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ store: new MemoryStore() }));
    const runs = { charge: 0, email: 0 };
    let attempt = 0;
    const outside: unknown[] = [];
    // Service code that is not handed the request.
    const charge = async () => {
      await sleep(1);
      const ctx = currentIdempotency() as IdempotencyContext;
      return ctx.step('charge', async () => {
        runs.charge++;
        return { id: `ch_${runs.charge}`, key: ctx.keyFor('charge') };
      });
    };
    app.post('/orders', async (req: express.Request, res: express.Response) => {
      try {
        await sleep(1);
        const same = currentIdempotency() === req.idempotency;
        const paid = await charge();
        if (++attempt === 1) {
          res.status(500).json({ error: 'crashed' });
          return;
        }
        await req.idempotency?.step('email', async () => {
          runs.email++;
        });
        res.status(201).json({ paid, same });
      } catch (error) {
        res.status(500).json({ error: String(error) });
      }
    });
    app.post('/plain', (_req: express.Request, res: express.Response) => {
      outside.push(currentIdempotency());
      res.json({});
    });
    const key = `steps-express-${Math.random()}`;
    await request(app).post('/orders').set('Idempotency-Key', key).send({ a: 1 }).expect(500);
    const done = await request(app).post('/orders').set('Idempotency-Key', key).send({ a: 1 }).expect(201);
    expect(done.body.same).toBe(true);
    expect(done.body.paid.id).toBe('ch_1');
    expect(done.body.paid.key).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const replay = await request(app).post('/orders').set('Idempotency-Key', key).send({ a: 1 }).expect(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs).toEqual({ charge: 1, email: 1 });
    // Another body under the key: 422 (the same key's record is done; a resumed one is refused the same way).
    await request(app).post('/orders').set('Idempotency-Key', key).send({ a: 2 }).expect(422);
    // Not covered (no key): no context.
    await request(app).post('/plain').send({}).expect(200);
    expect(outside).toEqual([undefined]);
  });

  test('a step still running when a sibling threw (Promise.all) is recorded before the key is released', async () => {
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ store: new MemoryStore() }));
    let charges = 0;
    let attempt = 0;
    app.post('/orders', async (req: express.Request, res: express.Response, next: express.NextFunction) => {
      const ctx = req.idempotency as IdempotencyContext;
      const first = ++attempt === 1;
      try {
        const [charge] = await Promise.all([
          ctx.step('charge', async () => {
            await sleep(50);
            return `ch_${++charges}`;
          }),
          ctx.step('reserve', async () => {
            if (first) throw new Error('stock service 503');
            return 'r';
          }),
        ]);
        res.status(201).json({ charge });
      } catch (error) {
        next(error);
      }
    });
    const key = `steps-express-in-flight-${Math.random()}`;
    await request(app).post('/orders').set('Idempotency-Key', key).send({ a: 1 }).expect(500);
    const done = await request(app).post('/orders').set('Idempotency-Key', key).send({ a: 1 }).expect(201);
    expect(done.body.charge).toBe('ch_1');
    expect(charges).toBe(1);
  });

  test('a resumed key sent with another body gets 422 and its steps stay', async () => {
    const store = new MemoryStore();
    const app = expressModule();
    app.use(expressModule.json());
    app.use(idempotency({ store }));
    let runs = 0;
    let attempt = 0;
    app.post('/pay', async (req: express.Request, res: express.Response) => {
      await req.idempotency?.step('charge', async () => ++runs);
      res.status(++attempt === 1 ? 503 : 200).json({ runs });
    });
    const key = `steps-express-mismatch-${Math.random()}`;
    await request(app).post('/pay').set('Idempotency-Key', key).send({ a: 1 }).expect(503);
    const steps = (await store.get(key))?.steps;
    await request(app).post('/pay').set('Idempotency-Key', key).send({ a: 2 }).expect(422);
    expect((await store.get(key))?.steps).toEqual(steps);
    await request(app).post('/pay').set('Idempotency-Key', key).send({ a: 1 }).expect(200);
    expect(runs).toBe(1);
  });
});

describe('Express: many concurrent requests', () => {
  let server: Server;
  let base: string;
  const runs = new Map<string, number>();
  const failed = new Set<string>();
  beforeAll(async () => {
    const app = express();
    app.use(express.json());
    app.use(idempotency({ store: new MemoryStore() }));
    const count = (name: string) => runs.set(name, (runs.get(name) ?? 0) + 1);
    app.post('/orders', async (_req: express.Request, res: express.Response) => {
      const ctx = currentIdempotency() as IdempotencyContext;
      try {
        const charge = await ctx.step('charge', async () => {
          count(`${ctx.key} charge`);
          await sleep(Math.random() * 5);
          return `ch_${ctx.key}`;
        });
        if (!failed.has(ctx.key)) {
          failed.add(ctx.key);
          throw new Error('between steps');
        }
        await ctx.step('outbox', async () => {
          count(`${ctx.key} outbox`);
          await sleep(Math.random() * 5);
        });
        res.status(201).json({ charge });
      } catch {
        res.status(500).json({});
      }
    });
    server = createServer(app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  test('200 requests over 5 keys, each retried until answered: each step function runs once per key', async () => {
    const keys = Array.from({ length: 5 }, (_, i) => `steps-many-${Math.random()}-${i}`);
    const answers = new Map<string, Set<string>>();
    const client = async (i: number) => {
      const key = keys[i % keys.length] as string;
      for (;;) {
        const res = await fetch(`${base}/orders`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: '{"amount":1}',
        });
        const body = (await res.json()) as { charge?: string };
        if (res.status === 201) {
          const seen = answers.get(key) ?? new Set();
          seen.add(body.charge as string);
          answers.set(key, seen);
          return;
        }
        expect([409, 500]).toContain(res.status);
        await sleep(5 + Math.random() * 10);
      }
    };
    await Promise.all(Array.from({ length: 200 }, (_, i) => client(i)));
    for (const key of keys) {
      expect(runs.get(`${key} charge`)).toBe(1);
      expect(runs.get(`${key} outbox`)).toBe(1);
      expect([...(answers.get(key) ?? [])]).toEqual([`ch_${key}`]);
    }
  });
});
