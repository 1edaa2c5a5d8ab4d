import { createHash } from 'node:crypto';
import {
  currentIdempotency,
  Idempotency,
  type IdempotencyContext,
  type IdempotencyHooks,
  IdempotencyMismatchError,
  type IdempotencyOptions,
  type IdempotencyStore,
  IdempotencyStoreError,
  idempotent,
  MemoryStore,
  StepError,
  type StepEvent,
} from '@oncely/core';
import {
  consumerRuntime,
  type Execution,
  type HttpRequestInput,
  runStoreTransaction,
  type TransactionalIdempotencyStore,
} from '@oncely/core/adapter';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
let serial = 0;
const newKey = (label: string) => `steps-${label}-${process.pid}-${++serial}`;

function input(key: string, body: unknown = { amount: 1 }): HttpRequestInput<unknown> {
  return { method: 'POST', url: '/orders', headers: { 'idempotency-key': key }, body, request: {} };
}

/**
 * One request through the engine: the handler runs inside the execution's context and answers a status, or throws
 * (the key is released). Resolves to the status answered, the handler's error, or the engine's own answer.
 */
async function request(
  engine: Idempotency,
  key: string,
  handler: (ctx: IdempotencyContext, execution: Execution) => Promise<number>,
  body?: unknown,
): Promise<{ status: number; replayed?: boolean; error?: unknown }> {
  const decision = await engine.handle(input(key, body));
  if (decision.action === 'pass') throw new Error('passed');
  if (decision.action === 'respond') return { status: decision.response.status, replayed: decision.replayed };
  const { execution } = decision;
  try {
    const status = await execution.run(() => handler(execution.context, execution));
    await execution.complete({ status, headers: {}, body: Buffer.from('{}') });
    return { status };
  } catch (error) {
    await execution.fail(error);
    return { status: 500, error };
  }
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection');
}

/** Counts each step function's runs, by name. */
function counter() {
  const runs = new Map<string, number>();
  return {
    runs,
    fn<T>(name: string, value: T): () => Promise<T> {
      return async () => {
        runs.set(name, (runs.get(name) ?? 0) + 1);
        return value;
      };
    },
  };
}

/** A handler that records a charge and fails its first attempt after it, so that the next attempt resumes. */
function failsOnce(c: ReturnType<typeof counter>) {
  let attempt = 0;
  return async (ctx: IdempotencyContext) => {
    await ctx.step('charge', c.fn('charge', 'ch'));
    if (++attempt === 1) throw new Error('again');
    return 200;
  };
}

/**
 * A slow charge beside a reservation that fails on the first attempt (Promise.all): the handler fails while the
 * charge still runs. Counts attempts and charge runs in `runs`.
 */
function chargeBesideReserve(ctx: IdempotencyContext, runs: { charges: number; attempts: number }) {
  const first = ++runs.attempts === 1;
  return Promise.all([
    ctx.step('charge', async () => {
      await sleep(50);
      return `ch_${++runs.charges}`;
    }),
    ctx.step('reserve', async () => {
      if (first) throw new Error('stock service 503');
      return 'r';
    }),
  ]);
}

/** A MemoryStore whose renewals never extend the lease, so that a lease lapses while its handler still runs. */
function unrenewed(inner: MemoryStore): IdempotencyStore {
  return {
    acquire: (key, options) => inner.acquire(key, options),
    complete: (key, token, response, ttlMs) => inner.complete(key, token, response, ttlMs),
    release: (key, token) => inner.release(key, token),
    renew: async () => true,
    recordStep: (key, token, name, value, ttlMs) => inner.recordStep(key, token, name, value, ttlMs),
    get: (key) => inner.get(key),
  };
}

class LegacyStore implements IdempotencyStore {
  readonly #inner = new MemoryStore();
  acquire: IdempotencyStore['acquire'] = (key, options) => this.#inner.acquire(key, options);
  complete: IdempotencyStore['complete'] = (key, token, response, ttlMs) =>
    this.#inner.complete(key, token, response, ttlMs);
  release: IdempotencyStore['release'] = (key, token) => this.#inner.release(key, token);
  renew: IdempotencyStore['renew'] = (key, token, ms) => this.#inner.renew(key, token, ms);
}

describe('HTTP: step() records, and a later attempt of the key replays', () => {
  test('after a thrown error, the recorded step is replayed and the first unrecorded step runs', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const key = newKey('thrown');
    const c = counter();
    let attempt = 0;
    const handler = async (ctx: IdempotencyContext) => {
      attempt++;
      const charge = await ctx.step('charge', c.fn('charge', { id: 'ch_1', at: new Date(0) }));
      expect(charge).toEqual({ id: 'ch_1', at: '1970-01-01T00:00:00.000Z' });
      if (attempt === 1) throw new Error('crashed between charge and email');
      await ctx.step('email', c.fn('email', undefined));
      return 201;
    };
    expect((await request(engine, key, handler)).status).toBe(500);
    expect((await store.get(key))?.steps).toEqual({
      charge: '{"id":"ch_1","at":"1970-01-01T00:00:00.000Z"}',
    });
    expect(await request(engine, key, handler)).toEqual({ status: 201 });
    expect(await request(engine, key, handler)).toEqual({ status: 201, replayed: true });
    expect(Object.fromEntries(c.runs)).toEqual({ charge: 1, email: 1 });
    expect(attempt).toBe(2);
    // A completed record holds its response only.
    expect((await store.get(key))?.steps).toBeUndefined();
  });

  test('after a released 5xx answer, the recorded step is replayed', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const key = newKey('5xx');
    const c = counter();
    let attempt = 0;
    const handler = async (ctx: IdempotencyContext) => {
      attempt++;
      await ctx.step('charge', c.fn('charge', 'ch_2'));
      return attempt === 1 ? 503 : 200;
    };
    expect((await request(engine, key, handler)).status).toBe(503);
    expect((await request(engine, key, handler)).status).toBe(200);
    expect(c.runs.get('charge')).toBe(1);
    expect(attempt).toBe(2);
  });

  test('after a lease lapsed (the handler given up, as after a crash), the recorded step is replayed', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store, lockTimeout: 500 });
    const key = newKey('lapse');
    const c = counter();
    const first = await engine.handle(input(key));
    if (first.action !== 'execute') throw new Error(first.action);
    await first.execution.run(() => first.execution.context.step('charge', c.fn('charge', 7)));
    first.execution.abandon(); // no renewal any more: the lease lapses as a dead process's would
    expect((await request(engine, key, async () => 200)).status).toBe(409);
    await sleep(700);
    const second = await request(engine, key, async (ctx) => {
      expect(await ctx.step('charge', c.fn('charge', 8))).toBe(7);
      return 200;
    });
    expect(second.status).toBe(200);
    expect(c.runs.get('charge')).toBe(1);
  });

  test('undefined is recorded as nothing and replayed as undefined without running', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const key = newKey('undefined');
    const c = counter();
    let attempt = 0;
    const results: unknown[] = [];
    const handler = async (ctx: IdempotencyContext) => {
      attempt++;
      results.push(await ctx.step('email', c.fn('email', undefined)));
      results.push(await ctx.step('null', c.fn('null', null)));
      if (attempt === 1) throw new Error('again');
      return 200;
    };
    await request(engine, key, handler);
    expect((await store.get(key))?.steps).toEqual({ email: '', null: 'null' });
    await request(engine, key, handler);
    expect(results).toEqual([undefined, null, undefined, null]);
    expect(Object.fromEntries(c.runs)).toEqual({ email: 1, null: 1 });
  });

  test('a name used twice in an attempt is refused, also while the first call runs; replayed names count', async () => {
    const engine = new Idempotency({ store: new MemoryStore() });
    const key = newKey('dup');
    const c = counter();
    let attempt = 0;
    const errors: unknown[] = [];
    const handler = async (ctx: IdempotencyContext) => {
      attempt++;
      if (attempt === 1) {
        const slow = ctx.step('a', async () => {
          await sleep(20);
          return c.fn('a', 1)();
        });
        errors.push(await rejection(ctx.step('a', c.fn('a', 2))));
        await slow;
        errors.push(await rejection(ctx.step('a', c.fn('a', 3))));
        throw new Error('again');
      }
      await ctx.step('a', c.fn('a', 4));
      errors.push(await rejection(ctx.step('a', c.fn('a', 5))));
      return 200;
    };
    await request(engine, key, handler);
    await request(engine, key, handler);
    expect(c.runs.get('a')).toBe(1);
    expect(errors).toHaveLength(3);
    for (const error of errors) {
      expect(error).toBeInstanceOf(StepError);
      expect(error).toMatchObject({ reason: 'duplicate-name', step: 'a' });
      expect((error as Error).message).toContain('"a"');
    }
  });

  test('an invalid name is refused before the function runs', async () => {
    const engine = new Idempotency({ store: new MemoryStore() });
    const c = counter();
    const errors: unknown[] = [];
    await request(engine, newKey('names'), async (ctx) => {
      for (const name of [
        '',
        'x'.repeat(201),
        'half \uD800 pair',
        'nul \u0000 byte',
        42 as unknown as string,
      ])
        errors.push(await rejection(ctx.step(name, c.fn('bad', 1))));
      expect(await ctx.step('y'.repeat(200), c.fn('long', 1))).toBe(1);
      expect(await ctx.step('paired \uD83D\uDE00', c.fn('emoji', 1))).toBe(1);
      return 200;
    });
    expect(errors).toHaveLength(5);
    for (const error of errors) expect(error).toMatchObject({ name: 'StepError', reason: 'invalid-name' });
    expect((errors[3] as Error).message).toContain('U+0000');
    expect(c.runs.get('bad')).toBeUndefined();
  });

  test('an unstorable result is refused after the function ran, and nothing is recorded', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const key = newKey('unstorable');
    const c = counter();
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const errors: unknown[] = [];
    await request(engine, key, async (ctx) => {
      errors.push(await rejection(ctx.step('cycle', c.fn('cycle', circular))));
      errors.push(await rejection(ctx.step('map', c.fn('map', new Map()) as () => Promise<never>)));
      errors.push(await rejection(ctx.step('fn', c.fn('fn', { f() {} }))));
      errors.push(await rejection(ctx.step('big', c.fn('big', 'x'.repeat(1_048_576)))));
      expect(await ctx.step('fits', c.fn('fits', 'x'.repeat(1_048_574)))).toHaveLength(1_048_574);
      throw new Error('keep the record');
    });
    expect(errors.map((e) => [(e as StepError).reason, (e as StepError).step])).toEqual([
      ['unstorable', 'cycle'],
      ['unstorable', 'map'],
      ['unstorable', 'fn'],
      ['unstorable', 'big'],
    ]);
    expect((errors[0] as Error).message).toMatch(/circular/);
    expect((errors[3] as Error).message).toMatch(/1048578 bytes/);
    expect(Object.keys((await store.get(key))?.steps ?? {})).toEqual(['fits']);
    expect(Object.fromEntries(c.runs)).toEqual({ cycle: 1, map: 1, fn: 1, big: 1, fits: 1 });
  });

  test('a step whose lease was taken over is refused (lease-lost), not recorded, and so is every later one', async () => {
    const inner = new MemoryStore();
    const fenced: unknown[] = [];
    const engine = new Idempotency({
      store: unrenewed(inner),
      lockTimeout: 500,
      hooks: { onFenced: (event) => fenced.push(event) },
    });
    const key = newKey('lost');
    const c = counter();
    const old = await engine.handle(input(key));
    if (old.action !== 'execute') throw new Error(old.action);
    const ctx = old.execution.context;
    await ctx.step('charge', c.fn('charge', 1));
    await sleep(700); // the lease lapses (renewals do not extend it)
    const taker = await engine.handle(input(key)); // resumes the key with a new token
    if (taker.action !== 'execute') throw new Error(taker.action);
    const lost = await rejection(ctx.step('email', c.fn('email', 'old')));
    expect(lost).toBeInstanceOf(StepError);
    expect(lost).toMatchObject({ reason: 'lease-lost', step: 'email' });
    expect(c.runs.get('email')).toBe(1); // ran, then refused
    const later = await rejection(ctx.step('later', c.fn('later', 1)));
    expect(later).toMatchObject({ reason: 'lease-lost', step: 'later' });
    expect(c.runs.get('later')).toBeUndefined();
    expect(fenced).toEqual([{ adapter: 'http', key, operation: 'recordStep' }]);
    expect((await inner.get(key))?.steps).toEqual({ charge: '1' });
    // The new owner replays the charge and records its own email.
    const tctx = taker.execution.context;
    expect(await tctx.step('charge', c.fn('charge', 2))).toBe(1);
    expect(await tctx.step('email', c.fn('email', 'new'))).toBe('new');
    expect((await inner.get(key))?.steps).toEqual({ charge: '1', email: '"new"' });
    await taker.execution.complete({ status: 200, headers: {}, body: Buffer.from('') });
    await old.execution.complete({ status: 200, headers: {}, body: Buffer.from('') });
  });

  test('a store that cannot record steps is named, and the function does not run', async () => {
    const c = counter();
    for (const hooks of [{}, { onStoreOperation() {} }] as IdempotencyHooks[]) {
      const engine = new Idempotency({ store: new LegacyStore(), hooks });
      let error: unknown;
      await request(engine, newKey('legacy'), async (ctx) => {
        error = await rejection(ctx.step('charge', c.fn('charge', 1)));
        expect(ctx.keyFor('charge')).toHaveLength(43);
        return 200;
      });
      expect(error).toMatchObject({ name: 'StepError', reason: 'unsupported-store', step: 'charge' });
      expect((error as Error).message).toContain('LegacyStore');
    }
    expect(c.runs.get('charge')).toBeUndefined();
  });

  test('a store that fails to record: IdempotencyStoreError recordStep, reported to onStoreError', async () => {
    const inner = new MemoryStore();
    const down = new Error('store down');
    const store: IdempotencyStore = {
      ...unrenewed(inner),
      renew: (key, token, ms) => inner.renew(key, token, ms),
      recordStep: async () => {
        throw down;
      },
    };
    const storeErrors: unknown[] = [];
    const operations: string[] = [];
    const engine = new Idempotency({
      store,
      hooks: {
        onStoreError: (event) => storeErrors.push(event),
        onStoreOperation: (event) => operations.push(`${event.operation}:${event.result}`),
      },
    });
    const key = newKey('down');
    let error: unknown;
    await request(engine, key, async (ctx) => {
      error = await rejection(ctx.step('charge', async () => 1));
      return 200;
    });
    expect(error).toBeInstanceOf(IdempotencyStoreError);
    expect(error).toMatchObject({ operation: 'recordStep', key, step: 'charge', cause: down });
    expect(storeErrors).toEqual([{ key, operation: 'recordStep', error: down }]);
    expect(operations).toContain('recordStep:error');
  });

  test('fail-open: with the store down, steps run unrecorded and keyFor works', async () => {
    let recorded = 0;
    const store: IdempotencyStore = {
      acquire: async () => {
        throw new Error('down');
      },
      complete: async () => true,
      release: async () => true,
      renew: async () => true,
      recordStep: async () => {
        recorded++;
        return true;
      },
    };
    const engine = new Idempotency({ store, onStoreError: 'fail-open' });
    const c = counter();
    const key = newKey('open');
    const results: unknown[] = [];
    for (let i = 0; i < 2; i++) {
      await request(engine, key, async (ctx, execution) => {
        expect(execution.protected).toBe(false);
        results.push(await ctx.step('charge', c.fn('charge', { at: new Date(0) })));
        results.push(ctx.keyFor('charge'));
        return 200;
      });
    }
    expect(c.runs.get('charge')).toBe(2);
    expect(recorded).toBe(0);
    expect(results[0]).toEqual({ at: '1970-01-01T00:00:00.000Z' });
    expect(results[1]).toBe(results[3]);
  });

  test('a step after the execution completed is refused as finished; one running when it completed is not recorded', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const key = newKey('finished');
    const decision = await engine.handle(input(key));
    if (decision.action !== 'execute') throw new Error(decision.action);
    const ctx = decision.execution.context;
    let release!: () => void;
    const running = ctx.step('late', () => new Promise<number>((resolve) => (release = () => resolve(1))));
    await decision.execution.complete({ status: 200, headers: {}, body: Buffer.from('{}') });
    release();
    expect(await rejection(running)).toMatchObject({ reason: 'finished', step: 'late' });
    const c = counter();
    expect(await rejection(ctx.step('after', c.fn('after', 1)))).toMatchObject({ reason: 'finished' });
    expect(c.runs.size).toBe(0);
    expect((await store.get(key))?.steps ?? {}).toEqual({});
  });

  test('a step still running when a sibling threw (Promise.all) is recorded before the key is released', async () => {
    const engine = new Idempotency({ store: new MemoryStore() });
    const key = newKey('in-flight');
    const runs = { charges: 0, attempts: 0 };
    const handler = async (ctx: IdempotencyContext) => {
      await chargeBesideReserve(ctx, runs);
      return 201;
    };
    expect(await request(engine, key, handler)).toMatchObject({ status: 500 });
    expect(await request(engine, key, handler)).toEqual({ status: 201 });
    expect(runs).toEqual({ charges: 1, attempts: 2 });
  });

  test('the wait for a running step is bounded by lockTimeout; the step is then refused as finished', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store, lockTimeout: 200 });
    const key = newKey('in-flight-bound');
    const decision = await engine.handle(input(key));
    if (decision.action !== 'execute') throw new Error(decision.action);
    const ctx = decision.execution.context;
    let release!: () => void;
    const running = ctx.step('stuck', () => new Promise<number>((resolve) => (release = () => resolve(1))));
    await decision.execution.fail(new Error('failed'));
    release();
    expect(await rejection(running)).toMatchObject({ reason: 'finished', step: 'stuck' });
    // Released: the next attempt acquires the key.
    const next = await engine.handle(input(key));
    expect(next.action).toBe('execute');
  });

  test('a retry with another fingerprint gets 422 and leaves the steps as they were', async () => {
    const store = new MemoryStore();
    const decisions: string[] = [];
    const engine = new Idempotency({ store, hooks: { onDecision: (e) => decisions.push(e.outcome) } });
    const key = newKey('mismatch');
    const c = counter();
    const handler = failsOnce(c);
    await request(engine, key, handler, { amount: 1 });
    const before = await store.get(key);
    expect(await request(engine, key, handler, { amount: 2 })).toEqual({ status: 422, replayed: false });
    const after = await store.get(key);
    expect(after?.steps).toEqual(before?.steps);
    expect(after?.state).toBe('released');
    expect(after?.fingerprint).toBe(before?.fingerprint);
    expect(decisions).toEqual(['executed', 'mismatch']);
    // The same request again resumes it.
    expect((await request(engine, key, handler, { amount: 1 })).status).toBe(200);
    expect(c.runs.get('charge')).toBe(1);
  });

  test('with fingerprint: false a resumed key is not compared', async () => {
    const engine = new Idempotency({ store: new MemoryStore(), fingerprint: false });
    const key = newKey('nofp');
    const c = counter();
    const handler = failsOnce(c);
    await request(engine, key, handler, { amount: 1 });
    expect((await request(engine, key, handler, { amount: 2 })).status).toBe(200);
    expect(c.runs.get('charge')).toBe(1);
  });

  test('currentIdempotency() is the execution context inside the handler, after awaits, and undefined outside', async () => {
    const engine = new Idempotency({ store: new MemoryStore() });
    const key = newKey('als');
    let seen: unknown[] = [];
    await request(engine, key, async (ctx) => {
      seen.push(currentIdempotency());
      await sleep(5);
      await new Promise((resolve) => setImmediate(resolve));
      seen.push(currentIdempotency());
      seen = seen.map((c) => c === ctx);
      return 200;
    });
    expect(seen).toEqual([true, true]);
    expect(currentIdempotency()).toBeUndefined();
  });

  test('keyFor is stable across attempts, differs by scope, key and name, and follows the documented formula', async () => {
    const store = new MemoryStore();
    const scoped = (tenant: string) =>
      new Idempotency({ store, scope: () => tenant } as IdempotencyOptions<unknown>);
    const key = newKey('keyfor');
    const seen: string[] = [];
    let attempt = 0;
    const handler = async (ctx: IdempotencyContext) => {
      seen.push(ctx.keyFor('charge'));
      if (++attempt === 1) throw new Error('again');
      return 200;
    };
    await request(scoped('t1'), key, handler);
    await request(scoped('t1'), key, handler);
    await request(scoped('t2'), key, handler);
    await request(scoped('t1'), `${key}-other`, handler);
    const names: string[] = [];
    await request(scoped('t1'), `${key}-names`, async (ctx) => {
      names.push(ctx.keyFor('charge'), ctx.keyFor('refund'));
      return 200;
    });
    const expected = createHash('sha256')
      .update(JSON.stringify(['oncely.keyFor.v1', `t1 ${key}`, 'charge']))
      .digest('base64url');
    expect(seen[0]).toBe(expected);
    expect(seen[1]).toBe(seen[0]);
    expect(new Set([seen[0], seen[2], seen[3], ...names]).size).toBe(5);
    for (const k of [...seen, ...names]) expect(k).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  test('onStep reports each step run and replayed; onStoreOperation times recordStep', async () => {
    const events: StepEvent[] = [];
    const operations: string[] = [];
    const engine = new Idempotency({
      store: new MemoryStore(),
      hooks: {
        onStep: (event) => events.push(event),
        onStoreOperation: (event) => operations.push(`${event.operation}:${event.result}:${event.store}`),
      },
    });
    const key = newKey('hooks');
    const handler = failsOnce(counter());
    await request(engine, key, handler);
    await request(engine, key, handler);
    expect(events).toEqual([
      { adapter: 'http', key, name: 'charge', outcome: 'run' },
      { adapter: 'http', key, name: 'charge', outcome: 'replayed' },
    ]);
    expect(operations.filter((o) => o.startsWith('recordStep'))).toEqual(['recordStep:ok:MemoryStore']);
  });

  test('200 concurrent requests over a few keys, retrying until answered: each step runs once per key', async () => {
    const engine = new Idempotency({ store: new MemoryStore() });
    const keys = Array.from({ length: 5 }, () => newKey('many'));
    const runs = new Map<string, number>();
    const failed = new Set<string>();
    const count = (name: string) => runs.set(name, (runs.get(name) ?? 0) + 1);
    const handler = async (ctx: IdempotencyContext) => {
      const charge = await ctx.step('charge', async () => {
        count(`${ctx.key} charge`);
        await sleep(Math.random() * 5);
        return `ch_${ctx.key}`;
      });
      // Each key's first attempt fails after its charge, so that its retries resume it.
      if (!failed.has(ctx.key)) {
        failed.add(ctx.key);
        throw new Error('between steps');
      }
      await ctx.step('email', async () => {
        count(`${ctx.key} email`);
        await sleep(Math.random() * 5);
      });
      expect(charge).toBe(`ch_${ctx.key}`);
      return 201;
    };
    const client = async (i: number) => {
      const key = keys[i % keys.length] as string;
      for (;;) {
        const { status } = await request(engine, key, handler);
        if (status === 201) return;
        await sleep(Math.random() * 3);
      }
    };
    await Promise.all(Array.from({ length: 200 }, (_, i) => client(i)));
    for (const key of keys) {
      expect(runs.get(`${key} charge`)).toBe(1);
      expect(runs.get(`${key} email`)).toBe(1);
    }
  });
});

describe('idempotent(): steps of the wrapped function', () => {
  test('replayed on the retry after a thrown error; keyFor from the key function; context only inside', async () => {
    const store = new MemoryStore();
    const c = counter();
    let attempt = 0;
    const seen: string[] = [];
    const placeOrder = idempotent(
      async (order: { id: string }) => {
        const ctx = currentIdempotency();
        if (ctx === undefined) throw new Error('no context');
        expect(ctx.key).toBe(order.id);
        seen.push(ctx.keyFor('charge'));
        const charge = await ctx.step('charge', c.fn('charge', { id: 'ch' }));
        if (++attempt === 1) throw new Error('crashed');
        await ctx.step('email', c.fn('email', undefined));
        return charge;
      },
      { store, key: (order) => order.id },
    );
    const id = newKey('fn');
    await expect(placeOrder({ id })).rejects.toThrow('crashed');
    expect((await store.get(id))?.steps).toEqual({ charge: '{"id":"ch"}' });
    expect(await placeOrder({ id })).toEqual({ id: 'ch' });
    expect(await placeOrder({ id })).toEqual({ id: 'ch' });
    expect(Object.fromEntries(c.runs)).toEqual({ charge: 1, email: 1 });
    expect(seen[0]).toBe(seen[1]);
    expect(seen[0]).toBe(
      createHash('sha256')
        .update(JSON.stringify(['oncely.keyFor.v1', id, 'charge']))
        .digest('base64url'),
    );
    expect(currentIdempotency()).toBeUndefined();
  });

  test('a step still running when a sibling threw (Promise.all) is recorded before the key is released', async () => {
    const runs = { charges: 0, attempts: 0 };
    const pay = idempotent(
      async (_order: string) => {
        await chargeBesideReserve(currentIdempotency() as IdempotencyContext, runs);
        return 'ok';
      },
      { key: (order: string) => order },
    );
    const order = newKey('fn-in-flight');
    expect(await rejection(pay(order))).toMatchObject({ message: 'stock service 503' });
    expect(await pay(order)).toBe('ok');
    expect(runs).toEqual({ charges: 1, attempts: 2 });
  });

  test('a step after the function returned is refused as finished', async () => {
    let ctx: IdempotencyContext | undefined;
    const fn = idempotent(
      async () => {
        ctx = currentIdempotency();
        return null;
      },
      { key: () => newKey('fn-finished') },
    );
    await fn();
    expect(await rejection((ctx as IdempotencyContext).step('late', async () => 1))).toMatchObject({
      reason: 'finished',
    });
  });

  test('maxResultBytes bounds a step result', async () => {
    const fn = idempotent(
      async () => {
        await (currentIdempotency() as IdempotencyContext).step('big', async () => 'x'.repeat(100));
        return null;
      },
      { key: () => newKey('fn-big'), maxResultBytes: 50 },
    );
    const error = await rejection(fn());
    expect(error).toMatchObject({ name: 'StepError', reason: 'unstorable', step: 'big' });
    expect((error as Error).message).toContain('maxResultBytes (50)');
  });

  test('a lease taken over after it lapsed: the old call is refused lease-lost and its step not recorded', async () => {
    const inner = new MemoryStore();
    const store = unrenewed(inner);
    const id = newKey('fn-lost');
    const c = counter();
    let gate!: () => void;
    const fn = idempotent(
      async (wait: boolean) => {
        const ctx = currentIdempotency() as IdempotencyContext;
        await ctx.step('charge', c.fn('charge', 1));
        if (wait) await new Promise<void>((resolve) => (gate = resolve));
        await ctx.step(wait ? 'email-old' : 'email-new', c.fn('email', 2));
        return null;
      },
      { store, key: () => id, lockTimeout: 500 },
    );
    const old = fn(true);
    await sleep(700);
    await fn(false);
    gate();
    expect(await rejection(old)).toMatchObject({
      name: 'StepError',
      reason: 'lease-lost',
      step: 'email-old',
    });
    expect(c.runs.get('charge')).toBe(1);
    expect(c.runs.get('email')).toBe(2);
  });

  test('resumed under another fingerprint: IdempotencyMismatchError, released, steps untouched', async () => {
    const store = new MemoryStore();
    const c = counter();
    let attempt = 0;
    const id = newKey('fn-mismatch');
    const fn = idempotent(
      async (_amount: number) => {
        await (currentIdempotency() as IdempotencyContext).step('charge', c.fn('charge', 1));
        if (++attempt === 1) throw new Error('again');
        return null;
      },
      { store, key: () => id, fingerprint: (amount) => String(amount) },
    );
    await expect(fn(1)).rejects.toThrow('again');
    const before = await store.get(id);
    await expect(fn(2)).rejects.toBeInstanceOf(IdempotencyMismatchError);
    const after = await store.get(id);
    expect(after?.state).toBe('released');
    expect(after?.steps).toEqual(before?.steps);
    expect(await fn(1)).toBeNull();
    expect(c.runs.get('charge')).toBe(1);
  });

  test('consumers: the handler resumes its steps on redelivery', async () => {
    const store = new MemoryStore();
    const c = counter();
    let attempt = 0;
    const runtime = consumerRuntime(
      async (msg: { key: string }) => {
        const ctx = currentIdempotency() as IdempotencyContext;
        expect(ctx.key).toBe(msg.key);
        await ctx.step('charge', c.fn('charge', 1));
        if (++attempt === 1) throw new Error('again');
        await ctx.step('email', c.fn('email', undefined));
      },
      { store },
      { name: 'test', options: [], keyOf: (msg) => msg.key, fingerprint: (msg) => msg.key },
    );
    const msg = { key: newKey('consumer') };
    expect((await runtime.decide(msg, 0)).settlement.action).toBe('retry');
    expect((await runtime.decide(msg, 1)).settlement).toEqual({ action: 'ack', reason: 'executed' });
    expect((await runtime.decide(msg, 2)).settlement).toEqual({ action: 'ack', reason: 'replayed' });
    expect(Object.fromEntries(c.runs)).toEqual({ charge: 1, email: 1 });
  });
});

describe('transactions: steps are part of the transaction', () => {
  function transactionalStore(): TransactionalIdempotencyStore & { recorded: number; db: object } {
    const inner = new MemoryStore();
    const db = { client: true };
    const store = {
      recorded: 0,
      db,
      acquire: inner.acquire.bind(inner),
      complete: inner.complete.bind(inner),
      release: inner.release.bind(inner),
      renew: inner.renew.bind(inner),
      recordStep: async () => {
        store.recorded++;
        return true;
      },
      async acquireInTransaction(key: string, options: { fingerprint: string; lockTimeoutMs: number }) {
        const result = await inner.acquire(key, options);
        if (result.status !== 'acquired') return result;
        return {
          status: 'acquired' as const,
          token: result.token,
          transaction: {
            db,
            commit: (response: Parameters<IdempotencyStore['complete']>[2], ttlMs: number) =>
              inner.complete(key, result.token, response, ttlMs),
            rollback: async () => {
              await inner.release(key, result.token);
            },
          },
        };
      },
    };
    return store;
  }

  test('runStoreTransaction: db on the context, steps run once per attempt and are not recorded', async () => {
    const store = transactionalStore();
    const c = counter();
    const key = newKey('tx');
    let attempt = 0;
    const work = async (db: unknown) => {
      const ctx = currentIdempotency() as IdempotencyContext;
      expect(ctx.db).toBe(db);
      expect(ctx.key).toBe(key);
      await ctx.step('charge', c.fn('charge', 1));
      expect(await rejection(ctx.step('charge', c.fn('charge', 1)))).toMatchObject({
        reason: 'duplicate-name',
      });
      if (++attempt === 1) throw new Error('rolled back');
      return 'done';
    };
    await expect(runStoreTransaction(store, key, { ttlMs: 60_000 }, work)).rejects.toThrow('rolled back');
    expect(await runStoreTransaction(store, key, { ttlMs: 60_000 }, work)).toEqual({
      outcome: 'executed',
      result: 'done',
    });
    // A rolled-back attempt's steps are gone with it: the retry runs them again.
    expect(c.runs.get('charge')).toBe(2);
    expect(store.recorded).toBe(0);
  });

  test('HTTP transactional mode: req.idempotency.db and unrecorded steps', async () => {
    const store = transactionalStore();
    const engine = new Idempotency({ store, transactional: true });
    const c = counter();
    const result = await request(engine, newKey('http-tx'), async (ctx) => {
      expect(ctx.db).toBe(store.db);
      expect(await ctx.step('charge', c.fn('charge', 5))).toBe(5);
      return 200;
    });
    expect(result.status).toBe(200);
    expect(store.recorded).toBe(0);
    expect(c.runs.get('charge')).toBe(1);
  });
});
