import { createHash, randomUUID } from 'node:crypto';
import {
  currentIdempotency,
  type IdempotencyContext,
  type IdempotencyStore,
  MemoryStore,
} from '@oncely/core';
import request from 'supertest';
import type { AdapterHarness, TestApp } from './suite-types';

/**
 * What `POST /steps` answers: the attempt (per key), the `charge` step's result, `keyFor('charge')`, and whether
 * `currentIdempotency()` was the adapter's own context at every point the route looked (after awaits too).
 */
export interface StepsAnswer {
  status: number;
  body:
    | { attempt: number; charge: { id: number } | null; keyFor: string; same: boolean }
    | { covered: false; current: boolean };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 1));

/**
 * The handler of `POST /steps[?fail=N]`, which every harness serves: `own` is the context the adapter exposes
 * (`req.idempotency`, `request.idempotency`, `ctx.state.idempotency`, `c.get('idempotency')`, `idempotencyOf()`),
 * `hit` the app's route counter. Counts "steps <key>" (the attempt), runs the step `charge` through
 * `currentIdempotency()` (unless `steps=0`; `charge` is then `null`), which counts "charge <key>" and returns
 * `{ id }`, and answers 500 while the attempt is at most `fail` (default 0), else 200, with a `StepsAnswer` body. A request oncely does not cover answers 200
 * `{ covered: false, current }`, `current` telling whether a context was seen all the same.
 */
export async function stepsRoute(
  own: IdempotencyContext | undefined,
  query: URLSearchParams | Record<string, unknown>,
  hit: (route: string) => number,
): Promise<StepsAnswer> {
  await tick();
  if (own === undefined)
    return { status: 200, body: { covered: false, current: currentIdempotency() !== undefined } };
  const get = (name: string) =>
    (query instanceof URLSearchParams ? query.get(name) : query[name]) ?? undefined;
  const fail = Number(get('fail') ?? 0);
  const attempt = hit(`steps ${own.key}`);
  const before = currentIdempotency();
  const charge =
    before === undefined || get('steps') === '0'
      ? null
      : await before.step('charge', () => ({ id: hit(`charge ${own.key}`) }));
  await tick();
  const same = before === own && currentIdempotency() === own;
  return {
    status: attempt <= fail ? 500 : 200,
    body: { attempt, charge, keyFor: own.keyFor('charge'), same },
  };
}

/** `keyFor(name)` of an unscoped request with `key`, by the documented formula. */
function expectedKeyFor(key: string, name: string): string {
  return createHash('sha256')
    .update(JSON.stringify(['oncely.keyFor.v1', key, name]))
    .digest('base64url');
}

/**
 * Steps through every adapter: a handler that runs a step, then answers 500, resumes on the retry with the step's
 * recorded result instead of running it again; `currentIdempotency()` is the adapter's own context inside the
 * handler. Runs on the harness's store when it records steps.
 */
export function stepsSuite(harness: AdapterHarness): void {
  const store: IdempotencyStore = harness.store?.() ?? new MemoryStore();
  const unsupported = typeof store.recordStep !== 'function';
  describe('the execution context and steps', () => {
    const apps: TestApp[] = [];
    const make = async () => {
      const app = await harness.create({});
      apps.push(app);
      return app;
    };
    afterEach(async () => {
      await Promise.all(apps.splice(0).map((app) => app.close()));
    });
    const newKey = () => `key-${randomUUID()}`;
    const post = (app: TestApp, path: string, key: string, body: object = { amount: 1 }) =>
      request(app.url).post(path).set('Idempotency-Key', key).send(body);

    test('currentIdempotency() is the context the adapter exposes, after awaits, in concurrent requests', async () => {
      const app = await make();
      const keys = Array.from({ length: 10 }, newKey);
      const answers = await Promise.all(keys.map((key) => post(app, '/steps?steps=0', key)));
      for (const [i, answer] of answers.entries()) {
        expect(answer.status).toBe(200);
        expect(answer.body).toEqual({
          attempt: 1,
          charge: null,
          keyFor: expectedKeyFor(keys[i] as string, 'charge'),
          same: true,
        });
      }
    });

    test('keyFor is the same on an attempt after a 500', async () => {
      const app = await make();
      const key = newKey();
      const first = await post(app, '/steps?steps=0&fail=1', key);
      const retry = await post(app, '/steps?steps=0&fail=1', key);
      expect([first.status, retry.status]).toEqual([500, 200]);
      expect(retry.body.attempt).toBe(2);
      expect(retry.body.keyFor).toBe(first.body.keyFor);
    });

    test('a request oncely does not cover sees no context', async () => {
      const app = await make();
      const res = await request(app.url).post('/steps').send({});
      expect(res.status).toBe(200);
      expect(res.body).toEqual({ covered: false, current: false });
    });

    const stepTest = unsupported ? test.skip : test;
    const skipped = unsupported ? ` (skipped: ${store.constructor.name} has no recordStep)` : '';

    stepTest(
      `a step recorded before a 500 is not run again: the retry gets its result and answers${skipped}`,
      async () => {
        const app = await make();
        const key = newKey();
        const first = await post(app, '/steps?fail=1', key);
        expect(first.status).toBe(500);
        expect(first.body).toMatchObject({ attempt: 1, charge: { id: 1 }, same: true });
        const retry = await post(app, '/steps?fail=1', key);
        expect(retry.status).toBe(200);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        // The handler ran twice, the charge once: the retry got the recorded charge.
        expect(retry.body).toMatchObject({ attempt: 2, charge: { id: 1 }, same: true });
        expect(app.count(`steps ${key}`)).toBe(2);
        expect(app.count(`charge ${key}`)).toBe(1);
        // keyFor is the same on both attempts, and is the documented hash of the key.
        expect(retry.body.keyFor).toBe(first.body.keyFor);
        expect(retry.body.keyFor).toBe(expectedKeyFor(key, 'charge'));
        // Completed: the answer is replayed, and nothing runs any more.
        const replay = await post(app, '/steps?fail=1', key);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.body).toEqual(retry.body);
        expect(app.count(`steps ${key}`)).toBe(2);
        expect(app.count(`charge ${key}`)).toBe(1);
      },
    );

    stepTest(`steps are per key: two keys at once run a charge each${skipped}`, async () => {
      const app = await make();
      const [a, b] = [newKey(), newKey()];
      const answers = await Promise.all([post(app, '/steps', a), post(app, '/steps', b)]);
      for (const answer of answers) expect(answer.status).toBe(200);
      expect(app.count(`charge ${a}`)).toBe(1);
      expect(app.count(`charge ${b}`)).toBe(1);
      // Each request saw its own context, not the other's, although both ran at once.
      expect(answers.map((answer) => answer.body.same)).toEqual([true, true]);
      expect(answers.map((answer) => answer.body.keyFor)).toEqual([
        expectedKeyFor(a, 'charge'),
        expectedKeyFor(b, 'charge'),
      ]);
    });

    stepTest(`a retry with another body gets a 422 and leaves the steps as they were${skipped}`, async () => {
      const app = await make();
      const key = newKey();
      expect((await post(app, '/steps?fail=1', key, { amount: 1 })).status).toBe(500);
      expect((await post(app, '/steps?fail=1', key, { amount: 2 })).status).toBe(422);
      const retry = await post(app, '/steps?fail=1', key, { amount: 1 });
      expect(retry.status).toBe(200);
      expect(retry.body).toMatchObject({ attempt: 2, charge: { id: 1 } });
      expect(app.count(`charge ${key}`)).toBe(1);
    });
  });
}
