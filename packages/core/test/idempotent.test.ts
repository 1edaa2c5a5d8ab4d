import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyOptionsError,
  IdempotencyReplayError,
  type IdempotencyStore,
  IdempotencyStoreError,
  idempotent,
  idempotentOutcome,
  type Logger,
  MemoryStore,
  PermanentError,
  UnstorableResultError,
} from '@oncely/core';
import { resolveConsumerRetryPolicy, settlementFor } from '@oncely/core/adapter';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Msg {
  id: string;
  amount: number;
}

let store: MemoryStore;
beforeEach(() => {
  store = new MemoryStore();
});
afterEach(async () => {
  await store.close();
});

/** Runs `promise` and returns what it threw (failing the test if it resolved). */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection');
}

function recordingLogger(): Logger & { lines: { level: string; msg: string | undefined }[] } {
  const lines: { level: string; msg: string | undefined }[] = [];
  const at = (level: string) => (_obj: object, msg?: string) => void lines.push({ level, msg });
  return { lines, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

describe('options are checked once, at construction', () => {
  const fn = async () => 1;
  test.each<[Record<string, unknown>, string]>([
    [{}, 'key'],
    [{ key: 'id' }, 'key'],
    [{ key: () => 'k', fingerprint: true }, 'fingerprint'],
    [{ key: () => 'k', ttl: 'soon' }, 'ttl'],
    [{ key: () => 'k', ttl: 0 }, 'ttl'],
    [{ key: () => 'k', lockTimeout: -1 }, 'lockTimeout'],
    [{ key: () => 'k', inProgress: 'wait' }, 'inProgress'],
    [{ key: () => 'k', inProgress: { wait: 'forever' } }, 'inProgress.wait'],
    [{ key: () => 'k', serialize: JSON }, 'serialize'],
    [
      { key: () => 'k', serialize: { serialize() {}, deserialize() {}, contentType: 1 } },
      'serialize.contentType',
    ],
    [{ key: () => 'k', isPermanent: true }, 'isPermanent'],
    [{ key: () => 'k', maxResultBytes: 0 }, 'maxResultBytes'],
    [{ key: () => 'k', maxKeyLength: 1.5 }, 'maxKeyLength'],
    [{ key: () => 'k', logger: { info() {} } }, 'logger'],
    [{ key: () => 'k', store: { acquire() {} } }, 'store'],
    [{ key: () => 'k', ttlMs: 5 }, 'ttlMs'],
  ])('%p is refused, naming %s', (options, name) => {
    const error = (() => {
      try {
        idempotent(fn, options as never);
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(error).toBeInstanceOf(IdempotencyOptionsError);
    expect((error as IdempotencyOptionsError).option).toBe(name);
    expect((error as Error).message).toMatch(new RegExp(`^oncely: option "${name.replace('.', '\\.')}" `));
  });

  test('a non-function is refused', () => {
    expect(() => idempotent('run' as never, { key: () => 'k' })).toThrow(IdempotencyOptionsError);
  });

  test("the caller's options object is not modified, and later changes to it do not leak in", async () => {
    const serializer = {
      contentType: 'text/plain',
      serialize: (n: number) => new TextEncoder().encode(String(n)),
      deserialize: (b: Uint8Array) => Number(new TextDecoder().decode(b)),
    };
    const options = Object.freeze({ store, key: (m: Msg) => m.id, ttl: '1h', serialize: serializer });
    const run = idempotent(async (m: Msg) => m.amount, options);
    serializer.serialize = () => {
      throw new Error('changed after construction');
    };
    await expect(run({ id: 'frozen', amount: 7 })).resolves.toBe(7);
    expect((await store.get('frozen'))?.response?.headers['content-type']).toBe('text/plain');
  });
});

describe('at most once per key', () => {
  test('100 concurrent calls with one key: fn runs once, the others are told it is in progress', async () => {
    let runs = 0;
    const charge = idempotent(
      async (m: Msg) => {
        runs++;
        await sleep(50);
        return { charged: m.amount };
      },
      { store, key: (m) => m.id },
    );
    const settled = await Promise.allSettled(
      Array.from({ length: 100 }, () => charge({ id: 'one', amount: 5 })),
    );
    expect(runs).toBe(1);
    const fulfilled = settled.filter((s) => s.status === 'fulfilled');
    const rejected = settled.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
    expect(fulfilled).toHaveLength(1);
    expect(rejected).toHaveLength(99);
    for (const r of rejected) {
      expect(r.reason).toBeInstanceOf(IdempotencyInProgressError);
      expect((r.reason as IdempotencyInProgressError).key).toBe('one');
      expect((r.reason as IdempotencyInProgressError).retryAfterMs).toBeGreaterThan(0);
      expect((r.reason as IdempotencyInProgressError).retryAfterMs).toBeLessThanOrEqual(30_000);
    }
    // After it finished, the key replays the stored result without running fn.
    await expect(charge({ id: 'one', amount: 5 })).resolves.toEqual({ charged: 5 });
    expect(runs).toBe(1);
  });

  test('100 concurrent calls in wait mode: fn runs once and every caller gets its result', async () => {
    let runs = 0;
    const charge = idempotentOutcome(
      async (m: Msg) => {
        runs++;
        await sleep(100);
        return { charged: m.amount, run: runs };
      },
      { store, key: (m) => m.id, inProgress: { wait: '5s' } },
    );
    const outcomes = await Promise.all(Array.from({ length: 100 }, () => charge({ id: 'w', amount: 3 })));
    expect(runs).toBe(1);
    expect(outcomes.filter((o) => o.outcome === 'executed')).toHaveLength(1);
    expect(outcomes.filter((o) => o.outcome === 'replayed')).toHaveLength(99);
    for (const o of outcomes) expect(o.result).toEqual({ charged: 3, run: 1 });
  });

  test.each([
    ['without store.waitFor', 'poll', undefined],
    ['with a store.waitFor that rejects', 'wake-fails', () => Promise.reject(new Error('subscriber down'))],
  ] as const)(
    'wait mode %s polls, and replays once the first call finishes',
    async (_label, key, waitFor) => {
      const pollingStore: IdempotencyStore = {
        acquire: (k, o) => store.acquire(k, o),
        complete: (k, t, r, ttl) => store.complete(k, t, r, ttl),
        release: (k, t) => store.release(k, t),
        renew: (k, t, l) => store.renew(k, t, l),
        ...(waitFor === undefined ? {} : { waitFor }),
      };
      let runs = 0;
      const run = idempotentOutcome(
        async () => {
          runs++;
          await sleep(150);
          return 'done';
        },
        { store: pollingStore, key: () => key, inProgress: { wait: '3s' } },
      );
      const [a, b] = await Promise.all([run(), sleep(10).then(() => run())]);
      expect(runs).toBe(1);
      expect([a.outcome, b.outcome].sort()).toEqual(['executed', 'replayed']);
      expect(b.result).toBe('done');
    },
  );

  test('wait mode gives up after the wait with IdempotencyInProgressError', async () => {
    let release!: () => void;
    const blocked = new Promise<void>((resolve) => {
      release = resolve;
    });
    const run = idempotent(
      async () => {
        await blocked;
        return 1;
      },
      { store, key: () => 'slow', inProgress: { wait: 200 } },
    );
    const first = run();
    await sleep(10);
    const started = Date.now();
    const error = await rejection(run());
    const waited = Date.now() - started;
    expect(error).toBeInstanceOf(IdempotencyInProgressError);
    expect(waited).toBeGreaterThanOrEqual(190);
    expect(waited).toBeLessThan(2000);
    release();
    await expect(first).resolves.toBe(1);
  });

  test('the lease is renewed while fn runs: a call after lockTimeout still finds it in progress', async () => {
    let runs = 0;
    const run = idempotent(
      async () => {
        runs++;
        await sleep(600);
        return 'ok';
      },
      { store, key: () => 'long', lockTimeout: 150 },
    );
    const first = run();
    await sleep(400); // well past the 150ms lease: only renewals keep it
    expect(await rejection(run())).toBeInstanceOf(IdempotencyInProgressError);
    await expect(first).resolves.toBe('ok');
    expect(runs).toBe(1);
  });

  test('a completed record older than ttl is treated as new', async () => {
    let runs = 0;
    const run = idempotent(async () => ++runs, { store, key: () => 'short-lived', ttl: 80 });
    await expect(run()).resolves.toBe(1);
    await expect(run()).resolves.toBe(1);
    await sleep(120);
    await expect(run()).resolves.toBe(2);
  });

  test('the key is computed once, before fn runs, from the arguments as they were', async () => {
    const keysSeen: string[] = [];
    const run = idempotentOutcome(
      async (m: Msg) => {
        m.id = 'mutated-by-fn'; // a handler that rewrites its input
        return m.amount;
      },
      {
        store,
        key: (m) => {
          keysSeen.push(m.id);
          return m.id;
        },
      },
    );
    const first = await run({ id: 'original', amount: 9 });
    expect(first).toEqual({ outcome: 'executed', result: 9, key: 'original' });
    expect(keysSeen).toEqual(['original']);
    expect((await store.get('original'))?.state).toBe('completed');
    expect(await store.get('mutated-by-fn')).toBeUndefined();
    // A redelivery of the original message replays; it does not run again.
    const again = await run({ id: 'original', amount: 9 });
    expect(again.outcome).toBe('replayed');
  });

  test('the stored record is a StoredResponse: status 200, a content-type, the JSON bytes', async () => {
    const run = idempotent(async () => ({ b: [1, 'two'], a: null }), { store, key: () => 'shape' });
    await run();
    const record = await store.get('shape');
    expect(record?.response?.status).toBe(200);
    expect(record?.response?.headers).toEqual({ 'content-type': 'application/json' });
    expect(new TextDecoder().decode(record?.response?.body)).toBe('{"b":[1,"two"],"a":null}');
  });
});

describe('outcome form', () => {
  test('executed, then replayed with the same result; idempotent.withOutcome is the same function', async () => {
    expect(idempotent.withOutcome).toBe(idempotentOutcome);
    let runs = 0;
    const run = idempotent.withOutcome(async (m: Msg) => ({ run: ++runs, amount: m.amount }), {
      store,
      key: (m) => `order:${m.id}`,
    });
    await expect(run({ id: 'a', amount: 1 })).resolves.toEqual({
      outcome: 'executed',
      result: { run: 1, amount: 1 },
      key: 'order:a',
    });
    await expect(run({ id: 'a', amount: 1 })).resolves.toEqual({
      outcome: 'replayed',
      result: { run: 1, amount: 1 },
      key: 'order:a',
    });
    expect(runs).toBe(1);
  });
});

describe('failures', () => {
  test('a thrown error releases the key: the error reaches the caller and a retry runs fn again', async () => {
    let runs = 0;
    const run = idempotent(
      async () => {
        runs++;
        if (runs === 1) throw new Error('database down');
        return 'second time lucky';
      },
      { store, key: () => 'flaky' },
    );
    const error = await rejection(run());
    expect((error as Error).message).toBe('database down');
    expect(await store.get('flaky')).toBeUndefined();
    await expect(run()).resolves.toBe('second time lucky');
    expect(runs).toBe(2);
  });

  test('a PermanentError is stored: duplicates get it again and fn does not run again', async () => {
    let runs = 0;
    const thrown = new PermanentError('card declined', { code: 'card_declined' });
    const run = idempotent(
      async () => {
        runs++;
        throw thrown;
      },
      { store, key: () => 'declined' },
    );
    expect(await rejection(run())).toBe(thrown); // the first caller gets its own error object
    const replayed = await rejection(run());
    expect(replayed).toBeInstanceOf(PermanentError);
    expect(replayed).toMatchObject({
      message: 'card declined',
      code: 'card_declined',
      originalName: 'PermanentError',
      replayed: true,
    });
    expect(runs).toBe(1);
    expect((await store.get('declined'))?.response?.status).toBe(500);
  });

  test('isPermanent classifies your own errors; the replay keeps their name and code', async () => {
    class ValidationError extends Error {
      override name = 'ValidationError';
      code = 'E_SCHEMA';
    }
    let runs = 0;
    const run = idempotent(
      async () => {
        runs++;
        throw new ValidationError('amount must be positive');
      },
      { store, key: () => 'invalid', isPermanent: (e) => e instanceof ValidationError },
    );
    expect(await rejection(run())).toBeInstanceOf(ValidationError);
    expect(await rejection(run())).toMatchObject({
      name: 'PermanentError',
      originalName: 'ValidationError',
      message: 'amount must be positive',
      code: 'E_SCHEMA',
      replayed: true,
    });
    expect(runs).toBe(1);
  });

  test('an isPermanent that throws counts the error as transient (the key is released)', async () => {
    const log = recordingLogger();
    let runs = 0;
    const run = idempotent(
      async () => {
        runs++;
        throw new Error('boom');
      },
      {
        store,
        key: () => 'bad-predicate',
        logger: log,
        isPermanent: () => {
          throw new Error('predicate bug');
        },
      },
    );
    expect((await rejection(run())) as Error).toHaveProperty('message', 'boom');
    expect((await rejection(run())) as Error).toHaveProperty('message', 'boom');
    expect(runs).toBe(2);
    expect(log.lines.some((l) => l.level === 'error' && /isPermanent threw/.test(l.msg ?? ''))).toBe(true);
  });

  test('a different fingerprint under a used key raises IdempotencyMismatchError and keeps the record', async () => {
    let runs = 0;
    const run = idempotent(async (m: Msg) => ({ run: ++runs, amount: m.amount }), {
      store,
      key: (m) => m.id,
      fingerprint: (m) => String(m.amount),
    });
    await run({ id: 'k', amount: 10 });
    const error = await rejection(run({ id: 'k', amount: 99 }));
    expect(error).toBeInstanceOf(IdempotencyMismatchError);
    expect((error as IdempotencyMismatchError).key).toBe('k');
    await expect(run({ id: 'k', amount: 10 })).resolves.toEqual({ run: 1, amount: 10 });
    expect(runs).toBe(1);
  });

  test('a mismatch is raised while the first call is still running, too', async () => {
    const run = idempotent(
      async (m: Msg) => {
        await sleep(100);
        return m.amount;
      },
      { store, key: (m) => m.id, fingerprint: (m) => String(m.amount) },
    );
    const first = run({ id: 'p', amount: 1 });
    await sleep(10);
    expect(await rejection(run({ id: 'p', amount: 2 }))).toBeInstanceOf(IdempotencyMismatchError);
    await expect(first).resolves.toBe(1);
  });

  test('a key function that throws or gives a bad key raises IdempotencyKeyError and fn never runs', async () => {
    let runs = 0;
    const fn = async () => ++runs;
    const cases = [
      idempotent(fn, {
        store,
        key: () => {
          throw new Error('no id');
        },
      }),
      idempotent(fn, { store, key: () => '' }),
      idempotent(fn, { store, key: () => undefined as unknown as string }),
      idempotent(fn, { store, key: () => 'x'.repeat(256) }),
      idempotent(fn, {
        store,
        key: () => 'fp',
        fingerprint: () => {
          throw new Error('bad');
        },
      }),
    ];
    for (const run of cases) expect(await rejection(run())).toBeInstanceOf(IdempotencyKeyError);
    expect(runs).toBe(0);
    await expect(idempotent(fn, { store, key: () => 'x'.repeat(300), maxKeyLength: 300 })()).resolves.toBe(1);
  });

  test('a store that fails on acquire raises IdempotencyStoreError and fn never runs', async () => {
    const down: IdempotencyStore = {
      acquire: async () => {
        throw new Error('ECONNREFUSED');
      },
      complete: async () => false,
      release: async () => false,
      renew: async () => false,
    };
    let runs = 0;
    const error = await rejection(idempotent(async () => ++runs, { store: down, key: () => 'k' })());
    expect(error).toBeInstanceOf(IdempotencyStoreError);
    expect(((error as IdempotencyStoreError).cause as Error).message).toBe('ECONNREFUSED');
    expect(runs).toBe(0);
  });

  test('a store that fails on complete: the caller still gets the result, and the failure is logged', async () => {
    const log = recordingLogger();
    const flaky: IdempotencyStore = {
      acquire: (k, o) => store.acquire(k, o),
      complete: async () => {
        throw new Error('timeout');
      },
      release: (k, t) => store.release(k, t),
      renew: (k, t, l) => store.renew(k, t, l),
    };
    const run = idempotent(async () => 'done', { store: flaky, key: () => 'lost-write', logger: log });
    await expect(run()).resolves.toBe('done');
    expect(log.lines.some((l) => l.level === 'error' && /could not store the result/.test(l.msg ?? ''))).toBe(
      true,
    );
  });

  test('a record written by the HTTP engine under the same key is not replayed as a result', async () => {
    const taken = await store.acquire('shared', { fingerprint: '', lockTimeoutMs: 1000 });
    if (taken.status !== 'acquired') throw new Error('unreachable');
    await store.complete('shared', taken.token, { status: 201, headers: {}, body: new Uint8Array() }, 60_000);
    let runs = 0;
    const error = await rejection(idempotent(async () => ++runs, { store, key: () => 'shared' })());
    expect(error).toBeInstanceOf(IdempotencyReplayError);
    expect(runs).toBe(0);
  });
});

describe('results that cannot be stored', () => {
  const circular: { self?: unknown } = {};
  circular.self = circular;
  test.each([
    ['undefined', undefined, /the result is undefined/],
    ['a function', () => 1, /a function/],
    ['a nested function', { ok: 1, callback: () => 1 }, /a function at property "callback"/],
    ['a BigInt', { total: 10n }, /a BigInt at property "total"/],
    ['a symbol', { tag: Symbol('x') }, /a symbol at property "tag"/],
    ['a Map', { index: new Map([[1, 2]]) }, /a Map at property "index"/],
    ['a circular structure', circular, /circular reference/],
    ['a result over maxResultBytes', 'x'.repeat(2000), /2002 bytes, more than maxResultBytes \(1000\)/],
  ])('%s: refused after fn ran once, and never run again', async (_label, value, reason) => {
    let runs = 0;
    // Typed unknown, as a value the types cannot see through would be: these results do not compile as they are.
    const run = idempotent(
      async (): Promise<unknown> => {
        runs++;
        return value;
      },
      { store, key: () => 'unstorable', maxResultBytes: 1000 },
    );
    const first = await rejection(run());
    expect(first).toBeInstanceOf(UnstorableResultError);
    expect(first).toMatchObject({ executed: true, replayed: false, key: 'unstorable' });
    expect((first as UnstorableResultError).reason).toMatch(reason);
    expect((first as Error).message).toMatch(/the function ran/);
    const duplicate = await rejection(run());
    expect(duplicate).toBeInstanceOf(UnstorableResultError);
    expect(duplicate).toMatchObject({ executed: true, replayed: true });
    expect((duplicate as UnstorableResultError).reason).toMatch(reason);
    expect(runs).toBe(1);
    expect((await store.get('unstorable'))?.response?.status).toBe(410);
  });

  test('null, and JSON-shaped values, are stored and replayed as JSON gives them back', async () => {
    let runs = 0;
    const run = idempotent(
      async () => {
        runs++;
        return { when: new Date(0), nothing: null, skipped: undefined };
      },
      { store, key: () => 'json' },
    );
    await run();
    await expect(run()).resolves.toEqual({ when: '1970-01-01T00:00:00.000Z', nothing: null });
    expect(runs).toBe(1);
    await expect(idempotent(async () => null, { store, key: () => 'null' })()).resolves.toBeNull();
  });

  test('the call that runs fn gets the same JSON round trip as its duplicates', async () => {
    let runs = 0;
    const run = idempotent(
      async () => {
        runs++;
        return { when: new Date(0), skipped: undefined, list: [1, undefined] };
      },
      { store, key: () => 'round-trip' },
    );
    const first = await run();
    const duplicate = await run();
    expect(runs).toBe(1);
    expect(first).toStrictEqual({ when: '1970-01-01T00:00:00.000Z', list: [1, null] });
    expect(duplicate).toStrictEqual(first);
    // A custom serialiser is trusted to give back fn's type: the first call gets fn's own value.
    const at = new Date(0);
    const custom = idempotent(async () => ({ at }), {
      store,
      key: () => 'custom-first',
      serialize: {
        serialize: (r) => new TextEncoder().encode(r.at.toISOString()),
        deserialize: (b) => ({ at: new Date(new TextDecoder().decode(b)) }),
      },
    });
    expect((await custom()).at).toBe(at);
    await expect(custom()).resolves.toStrictEqual({ at: new Date(0) });
  });

  test('a custom serializer stores what JSON cannot, with its content-type', async () => {
    const run = idempotent(async () => ({ total: 12345678901234567890n }), {
      store,
      key: () => 'bigint',
      serialize: {
        contentType: 'application/x-bigint',
        serialize: (r) => new TextEncoder().encode(r.total.toString()),
        deserialize: (b) => ({ total: BigInt(new TextDecoder().decode(b)) }),
      },
    });
    await run();
    await expect(run()).resolves.toEqual({ total: 12345678901234567890n });
    expect((await store.get('bigint'))?.response?.headers['content-type']).toBe('application/x-bigint');
  });

  test('a serializer that throws or returns no bytes: refused as unstorable', async () => {
    let runs = 0;
    const throwing = idempotent(async () => ++runs, {
      store,
      key: () => 's1',
      serialize: {
        serialize: () => {
          throw new Error('cannot encode');
        },
        deserialize: () => 0,
      },
    });
    const e1 = await rejection(throwing());
    expect((e1 as UnstorableResultError).reason).toBe('serialize() threw: cannot encode');
    const wrongType = idempotent(async () => ++runs, {
      store,
      key: () => 's2',
      serialize: { serialize: () => 'text' as unknown as Uint8Array, deserialize: () => 0 },
    });
    const e2 = await rejection(wrongType());
    expect((e2 as UnstorableResultError).reason).toBe('serialize() returned string, not a Uint8Array');
    expect(runs).toBe(2);
  });
});

describe('consumer retry policy (shared by @oncely/amqp and @oncely/nats)', () => {
  const policy = resolveConsumerRetryPolicy({ maxAttempts: 3, retryDelay: 500, inProgressDelay: '2s' });

  test('each error maps to the documented action', () => {
    expect(settlementFor(policy, new IdempotencyInProgressError('k', 10), 0)).toEqual({
      action: 'delay',
      reason: 'in-progress',
      delayMs: 2000,
    });
    expect(settlementFor(policy, new IdempotencyStoreError('k', 'acquire', { cause: 1 }), 0)).toMatchObject({
      action: 'delay',
      reason: 'store-error',
    });
    expect(settlementFor(policy, new UnstorableResultError('k', 'x', false), 0)).toEqual({
      action: 'ack',
      reason: 'unstorable',
    });
    expect(settlementFor(policy, new IdempotencyMismatchError('k'), 0)).toMatchObject({
      action: 'dead-letter',
      reason: 'mismatch',
    });
    expect(settlementFor(policy, new IdempotencyKeyError('bad'), 0)).toMatchObject({
      action: 'dead-letter',
      reason: 'invalid-key',
    });
    expect(settlementFor(policy, new PermanentError('no'), 0)).toMatchObject({
      action: 'dead-letter',
      reason: 'permanent',
    });
    expect(settlementFor(policy, new Error('transient'), 0)).toMatchObject({
      action: 'retry',
      failures: 1,
      delayMs: 500,
    });
    expect(settlementFor(policy, new Error('transient'), 1)).toMatchObject({ action: 'retry', failures: 2 });
    expect(settlementFor(policy, new Error('transient'), 2)).toMatchObject({
      action: 'dead-letter',
      reason: 'retries-exhausted',
    });
  });

  test('defaults: 5 attempts, 1s in-progress delay, retry delay doubling from 1s to at most 60s', () => {
    const d = resolveConsumerRetryPolicy({});
    expect(d.maxAttempts).toBe(5);
    expect(d.inProgressDelayMs).toBe(1000);
    expect([1, 2, 3, 7, 20].map((n) => d.retryDelayMs(n))).toEqual([1000, 2000, 4000, 60_000, 60_000]);
  });

  test('a retryDelay function is used, and a bad answer from it falls back to the default', () => {
    const p = resolveConsumerRetryPolicy({
      retryDelay: (n) => (n === 2 ? ('nonsense' as never) : `${n * 100}ms`),
    });
    expect(p.retryDelayMs(1)).toBe(100);
    expect(p.retryDelayMs(2)).toBe(2000);
  });

  test('bad retry options are refused, naming the option', () => {
    for (const [options, name] of [
      [{ maxAttempts: 0 }, 'maxAttempts'],
      [{ retryDelay: 'later' }, 'retryDelay'],
      [{ inProgressDelay: 0 }, 'inProgressDelay'],
      [{ isPermanent: 'yes' }, 'isPermanent'],
    ] as const) {
      let error: unknown;
      try {
        resolveConsumerRetryPolicy(options as never);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(IdempotencyOptionsError);
      expect((error as IdempotencyOptionsError).option).toBe(name);
    }
  });
});

test('docs/consumers.md lists every option idempotent() takes', () => {
  let known: string[] = [];
  try {
    idempotent(async () => 1, { key: () => 'k', notAnOption: true } as never);
  } catch (error) {
    known = (/known options: (.*)\.$/.exec((error as Error).message)?.[1] ?? '').split(', ');
  }
  expect(known).toContain('hooks');
  const docs = readFileSync(join(__dirname, '../../../docs/consumers.md'), 'utf8');
  const listed = new Set([...docs.matchAll(/^- `([a-zA-Z]+)` \(/gm)].map((match) => match[1]));
  expect(known.filter((name) => !listed.has(name))).toEqual([]);
});
