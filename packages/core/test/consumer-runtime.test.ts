import {
  type IdempotencyHooks,
  IdempotencyInProgressError,
  IdempotencyMismatchError,
  IdempotencyOptionsError,
  MemoryStore,
  PermanentError,
  type StoredResponse,
  UnstorableResultError,
} from '../src';
import { type AcquireOptions, type ConsumerOptions, consumerRuntime, type WorkerVerbs } from '../src/adapter';

/** A broker's message, as a wrapper would see it. */
interface Message {
  id?: string;
  body: string;
}

const broker = {
  name: '@oncely/test-broker',
  options: ['key'],
  keyOf: (msg: Message) => msg.id,
  fingerprint: (msg: Message) => msg.body,
};

const runtimeWith = (options: ConsumerOptions<Message> = {}) =>
  consumerRuntime<Message>(() => {}, { store: new MemoryStore(), ...options }, broker);

describe('consumerRuntime: one delivery, one settlement in neutral words', () => {
  test('first delivery runs the work and acks; a duplicate acks as replayed without running it', async () => {
    const runtime = runtimeWith();
    let runs = 0;
    const work = () => {
      runs++;
    };
    expect(await runtime.decide({ id: 'a', body: 'x' }, 0, work)).toEqual({
      key: 'a',
      settlement: { action: 'ack', reason: 'executed' },
    });
    expect(await runtime.decide({ id: 'a', body: 'x' }, 0, work)).toEqual({
      key: 'a',
      settlement: { action: 'ack', reason: 'replayed' },
    });
    expect(runs).toBe(1);
  });

  test('a key held by a running delivery: delay by inProgressDelay, nothing run, no failure counted', async () => {
    const runtime = runtimeWith({ inProgressDelay: '2s' });
    let release!: () => void;
    const first = runtime.decide({ id: 'b', body: 'x' }, 0, () => new Promise<void>((r) => (release = r)));
    await new Promise((resolve) => setImmediate(resolve));
    let ran = false;
    const second = await runtime.decide({ id: 'b', body: 'x' }, 0, () => {
      ran = true;
    });
    expect(second.settlement).toEqual({ action: 'delay', reason: 'in-progress', delayMs: 2000 });
    expect(ran).toBe(false);
    release();
    expect((await first).settlement.action).toBe('ack');
  });

  test('work that throws: retry with the failures counted and the policy delay, then dead-letter at maxAttempts', async () => {
    const runtime = runtimeWith({ maxAttempts: 3, retryDelay: (failures) => failures * 100 });
    const boom = new Error('boom');
    const fail = () => {
      throw boom;
    };
    expect((await runtime.decide({ id: 'c', body: 'x' }, 0, fail)).settlement).toEqual({
      action: 'retry',
      reason: 'failed',
      delayMs: 100,
      failures: 1,
      error: boom,
    });
    expect((await runtime.decide({ id: 'c', body: 'x' }, 1, fail)).settlement).toMatchObject({
      action: 'retry',
      delayMs: 200,
      failures: 2,
    });
    expect((await runtime.decide({ id: 'c', body: 'x' }, 2, fail)).settlement).toEqual({
      action: 'dead-letter',
      reason: 'retries-exhausted',
      error: boom,
    });
  });

  test('a permanent error is dead-lettered at once, and so is its duplicate', async () => {
    const runtime = runtimeWith();
    const permanent = () => {
      throw new PermanentError('card declined');
    };
    expect((await runtime.decide({ id: 'd', body: 'x' }, 0, permanent)).settlement).toMatchObject({
      action: 'dead-letter',
      reason: 'permanent',
    });
    let ran = false;
    const again = await runtime.decide({ id: 'd', body: 'x' }, 0, () => {
      ran = true;
    });
    expect(again.settlement).toMatchObject({ action: 'dead-letter', reason: 'permanent' });
    expect(ran).toBe(false);
  });

  test('a key reused for a different message is dead-lettered as a mismatch; fingerprint: false turns that off', async () => {
    const runtime = runtimeWith();
    await runtime.decide({ id: 'e', body: 'one' }, 0, () => {});
    expect((await runtime.decide({ id: 'e', body: 'two' }, 0, () => {})).settlement).toMatchObject({
      action: 'dead-letter',
      reason: 'mismatch',
    });
    const unchecked = runtimeWith({ fingerprint: false });
    await unchecked.decide({ id: 'e', body: 'one' }, 0, () => {});
    expect((await unchecked.decide({ id: 'e', body: 'two' }, 0, () => {})).settlement).toEqual({
      action: 'ack',
      reason: 'replayed',
    });
  });

  test('hooks are called as methods of the hooks object: a plain-object hook may use this', async () => {
    const seen: string[] = [];
    const hooks = {
      note(outcome: string) {
        seen.push(outcome);
      },
      onDecision(this: { note(outcome: string): void }, event: { outcome: string }) {
        this.note(event.outcome);
      },
    };
    const runtime = runtimeWith({ hooks });
    await runtime.decide({ body: 'no key' }, 0, () => {});
    await runtime.decide({ id: 'h', body: 'x' }, 0, () => {});
    expect(seen).toEqual(['rejected', 'executed']);
  });

  test('no key: dead-lettered, or run unprotected with onMissingKey: process; a throwing key function is invalid-key', async () => {
    let runs = 0;
    const work = () => {
      runs++;
    };
    expect((await runtimeWith().decide({ body: 'x' }, 0, work)).settlement).toEqual({
      action: 'dead-letter',
      reason: 'missing-key',
    });
    const processing = runtimeWith({ onMissingKey: 'process' });
    await processing.decide({ body: 'x' }, 0, work);
    await processing.decide({ body: 'x' }, 0, work);
    expect(runs).toBe(2);
    const throwing = consumerRuntime<Message>(
      () => {},
      {},
      {
        ...broker,
        keyOf: () => {
          throw new Error('no header');
        },
      },
    );
    expect((await throwing.decide({ body: 'x' }, 0, work)).settlement).toMatchObject({
      action: 'dead-letter',
      reason: 'invalid-key',
    });
  });

  test('a key with a lone surrogate is invalid-key, on the plain and the transactional path; a fingerprint with one matches itself', async () => {
    // A UTF-8 store (Redis, PostgreSQL, DynamoDB) would read 'a\uD800' and 'a\uDBFF' as one key (redis unicode.test.ts).
    let runs = 0;
    const work = () => {
      runs++;
    };
    const plain = await runtimeWith().decide({ id: 'a\uD800', body: 'x' }, 0, work);
    expect(plain.settlement).toMatchObject({ action: 'dead-letter', reason: 'invalid-key' });
    let transactions = 0;
    const transactional = consumerRuntime<Message>(
      () => {},
      {},
      {
        ...broker,
        runInTransaction: async () => {
          transactions++;
          return { outcome: 'executed' as const, result: 1 };
        },
      },
    );
    const inTransaction = await transactional.decide({ id: 'a\uDBFF', body: 'x' }, 0);
    expect(inTransaction.settlement).toMatchObject({ action: 'dead-letter', reason: 'invalid-key' });
    expect(runs + transactions).toBe(0);
    // The fingerprint is compared as a UTF-8 store gives it back, so the same message is a replay there too.
    const runtime = runtimeWith();
    expect((await runtime.decide({ id: 'f', body: 'cut \uD83D' }, 0, work)).settlement.reason).toBe(
      'executed',
    );
    expect((await runtime.decide({ id: 'f', body: 'cut \uD83D' }, 0, work)).settlement.reason).toBe(
      'replayed',
    );
    expect(runs).toBe(1);
  });

  test('a store that is down: delay (nothing ran, nothing counted)', async () => {
    const down = new MemoryStore();
    down.acquire = async () => {
      throw new Error('connection refused');
    };
    const runtime = consumerRuntime<Message>(() => {}, { store: down, inProgressDelay: 500 }, broker);
    let ran = false;
    const { settlement } = await runtime.decide({ id: 'f', body: 'x' }, 0, () => {
      ran = true;
    });
    expect(settlement).toEqual({ action: 'delay', reason: 'store-error', delayMs: 500 });
    expect(ran).toBe(false);
  });

  test('settledEvent carries the delay and error; report swallows an onSettled that throws, with a log line', async () => {
    const lines: string[] = [];
    const logger = {
      debug: () => {},
      info: () => {},
      warn: () => {},
      error: (_obj: object, msg?: string) => void lines.push(msg ?? ''),
    };
    const runtime = runtimeWith({
      logger,
      onSettled: () => {
        throw new Error('metrics down');
      },
    });
    const error = new Error('x');
    const event = runtime.settledEvent(
      { id: 'g', body: 'x' },
      'g',
      { action: 'retry', reason: 'failed', delayMs: 250, failures: 1, error },
      1,
    );
    expect(event).toEqual({
      key: 'g',
      action: 'retry',
      reason: 'failed',
      failures: 1,
      delayMs: 250,
      error,
      message: { id: 'g', body: 'x' },
    });
    expect(() => runtime.report(event)).not.toThrow();
    expect(lines).toEqual(['oncely: onSettled threw; ignored']);
  });

  test('options are checked once, naming the option and the package', () => {
    expect(() => consumerRuntime<Message>(() => {}, { nope: 1 } as never, broker)).toThrow(
      /nope.*is not an option of @oncely\/test-broker/,
    );
    expect(() => consumerRuntime<Message>('no' as never, {}, broker)).toThrow(IdempotencyOptionsError);
    expect(() => consumerRuntime<Message>(() => {}, { onMissingKey: 'drop' as never }, broker)).toThrow(
      /onMissingKey/,
    );
    expect(() => consumerRuntime<Message>(() => {}, { maxAttempts: 0 }, broker)).toThrow(/maxAttempts/);
    expect(() => consumerRuntime<Message>(() => {}, { onSettled: 'x' as never }, broker)).toThrow(
      /onSettled/,
    );
    // The broker's own options are known.
    expect(() => consumerRuntime<Message>(() => {}, { key: 'id' } as never, broker)).not.toThrow();
  });
});

describe('consumerRuntime: the transactional path (runInTransaction) reports its decisions like the plain one', () => {
  test('executed, replayed, conflict, mismatch and rejected reach onDecision, with the store key', async () => {
    const decisions: { outcome: string; key?: string }[] = [];
    const answers: (() => Promise<{ outcome: 'executed' | 'replayed'; result: unknown }>)[] = [
      async () => ({ outcome: 'executed', result: 1 }),
      async () => ({ outcome: 'replayed', result: 1 }),
      async () => {
        throw new IdempotencyInProgressError('t', 1000);
      },
      async () => {
        throw new IdempotencyMismatchError('t');
      },
      async () => {
        throw new Error('the work failed: rolled back, no decision to count');
      },
    ];
    let calls = 0;
    const runtime = consumerRuntime<Message>(
      () => {},
      {
        maxKeyLength: 5,
        hooks: { onDecision: (event) => void decisions.push({ outcome: event.outcome, key: event.key }) },
      },
      {
        ...broker,
        storeResults: true,
        runInTransaction: () => {
          const answer = answers[calls++];
          if (answer === undefined) throw new Error('called too often');
          return answer();
        },
      },
    );
    const settled = [];
    for (let i = 0; i < answers.length; i++) settled.push(await runtime.decide({ id: 't', body: 'x' }, 0));
    // A key longer than maxKeyLength never reaches the transaction.
    settled.push(await runtime.decide({ id: 'too-long', body: 'x' }, 0));
    expect(calls).toBe(answers.length);
    expect(settled.map((d) => d.settlement.action)).toEqual([
      'ack',
      'ack',
      'delay',
      'dead-letter',
      'retry',
      'dead-letter',
    ]);
    expect(settled[0]?.result).toBe(1);
    expect(decisions).toEqual([
      { outcome: 'executed', key: 't' },
      { outcome: 'replayed', key: 't' },
      { outcome: 'conflict', key: 't' },
      { outcome: 'mismatch', key: 't' },
      { outcome: 'rejected', key: undefined },
    ]);
  });
});

describe('consumerRuntime: the transactional path the runtime runs itself (workInTransaction)', () => {
  /** A MemoryStore whose transactions are its own acquire, complete and release (as a PostgresStore's are). */
  class TransactionalMemoryStore extends MemoryStore {
    async acquireInTransaction(key: string, options: AcquireOptions) {
      const result = await this.acquire(key, options);
      if (result.status !== 'acquired') return result;
      const { token } = result;
      return {
        ...result,
        transaction: {
          db: { key },
          commit: (response: StoredResponse, ttlMs: number) => this.complete(key, token, response, ttlMs),
          rollback: async () => void (await this.release(key, token)),
        },
      };
    }
  }

  test('the key protocol and its hooks: commit, rollback, replay, conflict, mismatch, as the plain path reports them', async () => {
    const store = new TransactionalMemoryStore();
    const events: string[] = [];
    const hooks: IdempotencyHooks = {
      onDecision: (e) => void events.push(`decision:${e.outcome}`),
      onComplete: (e) => void events.push(`complete:${e.key}`),
      onRelease: (e) => void events.push(`release:${e.key}:${e.reason}`),
      onExecutionStart: (e) => void events.push(`start:${e.key}`),
      onExecutionEnd: (e) => void events.push(`end:${e.key}`),
      onStoreOperation: (e) => void events.push(`op:${e.operation}:${e.result}`),
    };
    const writes: unknown[] = [];
    let fail = true;
    const runtime = consumerRuntime<Message>(
      () => {},
      { store, hooks },
      {
        ...broker,
        storeResults: true,
        workInTransaction: async (msg, key, db) => {
          writes.push(db);
          if (fail) {
            fail = false;
            throw new Error('the work failed: rolled back');
          }
          return { shipped: msg.body, key };
        },
      },
    );
    const failed = await runtime.decide({ id: 't', body: 'x' }, 0);
    expect(failed.settlement).toMatchObject({ action: 'retry', reason: 'failed' });
    const done = await runtime.decide({ id: 't', body: 'x' }, 1);
    expect(done).toEqual({
      key: 't',
      settlement: { action: 'ack', reason: 'executed' },
      result: { shipped: 'x', key: 't' },
    });
    const duplicate = await runtime.decide({ id: 't', body: 'x' }, 0);
    expect(duplicate).toEqual({
      key: 't',
      settlement: { action: 'ack', reason: 'replayed' },
      result: { shipped: 'x', key: 't' },
    });
    const mismatch = await runtime.decide({ id: 't', body: 'other' }, 0);
    expect(mismatch.settlement).toMatchObject({ action: 'dead-letter', reason: 'mismatch' });
    // The work got the transaction's client, twice (the failed run and the committed one).
    expect(writes).toEqual([{ key: 't' }, { key: 't' }]);
    expect(events).toEqual([
      'op:acquire:ok',
      'start:t',
      'op:release:ok',
      'release:t:error',
      'end:t',
      'op:acquire:ok',
      'start:t',
      'op:complete:ok',
      'complete:t',
      'end:t',
      'decision:executed',
      'op:acquire:ok',
      'decision:replayed',
      'op:acquire:ok',
      'decision:mismatch',
    ]);
    // A duplicate of a transaction still open is delayed as in progress.
    await store.acquire('held', { fingerprint: 'x', lockTimeoutMs: 30_000 });
    expect((await runtime.decide({ id: 'held', body: 'x' }, 0)).settlement).toMatchObject({
      action: 'delay',
      reason: 'in-progress',
    });
    await store.close();
  });

  test('a store that does not run transactions is refused at construction, naming the option', () => {
    expect(() =>
      consumerRuntime<Message>(
        () => {},
        { store: new MemoryStore() },
        { ...broker, workInTransaction: () => null },
      ),
    ).toThrow(IdempotencyOptionsError);
  });

  test('lockTimeout and inProgress, which the open transaction makes moot, are refused at construction by name', () => {
    const transactional = { ...broker, workInTransaction: () => null };
    const refusal = (options: ConsumerOptions<Message>): unknown => {
      try {
        consumerRuntime<Message>(
          () => {},
          { store: new TransactionalMemoryStore(), ...options },
          transactional,
        );
      } catch (error) {
        return error;
      }
      return undefined;
    };
    for (const [option, options] of [
      ['lockTimeout', { lockTimeout: '5s' }],
      ['inProgress', { inProgress: { wait: '2s' } }],
      ['inProgress', { inProgress: 'reject' }],
    ] as const) {
      const error = refusal(options);
      expect(error).toBeInstanceOf(IdempotencyOptionsError);
      expect((error as IdempotencyOptionsError).option).toBe(option);
      expect((error as Error).message).toContain('@oncely/test-broker');
    }
    expect(refusal({})).toBeUndefined();
  });
});

describe('consumerRuntime.settleInWorker: for brokers that retry themselves and hold a message while it runs', () => {
  const delivery = (over: Partial<WorkerDelivery> = {}): WorkerDelivery => ({
    id: 'job-1',
    failuresBefore: 0,
    expiresAt: Date.now() + 60_000,
    stopped: () => false,
    retries: {},
    ...over,
  });
  type WorkerDelivery = Parameters<ReturnType<typeof runtimeWith>['settleInWorker']>[1];

  test('a held key is waited for in the worker (no attempt counted), then the replay is acked with the stored result', async () => {
    const store = new MemoryStore();
    const events: string[] = [];
    const runtime = consumerRuntime<Message>(
      () => ({ n: 1 }),
      {
        store,
        inProgressDelay: 20,
        onSettled: (e) => void events.push(`${e.action}:${e.reason}:${e.failures}`),
      },
      { ...broker, storeResults: true },
    );
    const held = await store.acquire('a', { fingerprint: 'x', lockTimeoutMs: 30_000 });
    if (held.status !== 'acquired') throw new Error('expected acquired');
    const acked: unknown[] = [];
    const settled = runtime.settleInWorker({ id: 'a', body: 'x' }, delivery(), {
      ack: async (result) => void acked.push(result),
      deadLetter: async () => {},
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    await store.complete('a', held.token, { status: 200, headers: {}, body: Buffer.from('{"n":2}') }, 60_000);
    expect(await settled).toBeUndefined();
    expect(acked).toEqual([{ n: 2 }]);
    expect(events.at(-1)).toBe('ack:replayed:0');
    expect(events.slice(0, -1).every((e) => e === 'delay:in-progress:0')).toBe(true);
    await store.close();
  });

  test('a held key past what the expiry allows, or once the worker stopped, is handed back to the broker', async () => {
    const store = new MemoryStore();
    await store.acquire('a', { fingerprint: 'x', lockTimeoutMs: 30_000 });
    const runtime = consumerRuntime<Message>(() => {}, { store, inProgressDelay: 20 }, broker);
    const verbs = { ack: async () => {}, deadLetter: async () => {} };
    expect(
      await runtime.settleInWorker({ id: 'a', body: 'x' }, delivery({ expiresAt: Date.now() + 10 }), verbs),
    ).toEqual({ id: 'job-1', key: 'a', reason: 'in-progress' });
    let stopped = false;
    const settled = runtime.settleInWorker(
      { id: 'a', body: 'x' },
      delivery({ stopped: () => stopped }),
      verbs,
    );
    stopped = true;
    expect(await settled).toEqual({ id: 'job-1', key: 'a', reason: 'in-progress' });
    await store.close();
  });

  test("a failure is handed back with the broker's delay (doubling with backoff, capped), the last attempt as dead-letter", async () => {
    const events: { action: string; reason: string; failures: number; delayMs?: number }[] = [];
    const error = new Error('boom');
    const runtime = runtimeWith({
      onSettled: ({ action, reason, failures, delayMs }) =>
        void events.push({ action, reason, failures, ...(delayMs === undefined ? {} : { delayMs }) }),
    });
    const verbs = { ack: async () => {}, deadLetter: async () => {} };
    const retries = { limit: 20, delayMs: 1000, backoff: true, maxDoublings: 3 };
    for (const failuresBefore of [0, 1, 5, 20]) {
      const handed = await consumerRuntime<Message>(
        () => {
          throw error;
        },
        // The broker counts attempts: the runtime's own limit is out of the way.
        {
          store: new MemoryStore(),
          maxAttempts: Number.MAX_SAFE_INTEGER,
          onSettled: (e) => runtime.report(e),
        },
        broker,
      ).settleInWorker({ id: `f${failuresBefore}`, body: 'x' }, delivery({ failuresBefore, retries }), verbs);
      expect(handed).toEqual({ id: 'job-1', key: `f${failuresBefore}`, reason: 'failed', error });
    }
    expect(events).toEqual([
      { action: 'retry', reason: 'failed', failures: 1, delayMs: 1000 },
      { action: 'retry', reason: 'failed', failures: 2, delayMs: 2000 },
      { action: 'retry', reason: 'failed', failures: 6, delayMs: 8000 },
      { action: 'dead-letter', reason: 'retries-exhausted', failures: 21 },
    ]);
  });

  test('a verb that fails is tried again, so a done message is not failed; one that keeps failing is handed back', async () => {
    const runtime = runtimeWith();
    let calls = 0;
    const blip = new Error('Connection terminated unexpectedly');
    expect(
      await runtime.settleInWorker({ id: 'v', body: 'x' }, delivery(), {
        ack: async () => {
          if (calls++ === 0) throw blip;
        },
        deadLetter: async () => {},
      }),
    ).toBeUndefined();
    expect(calls).toBe(2);
    const failing = await runtime.settleInWorker(
      { id: 'w', body: 'x' },
      delivery({ expiresAt: Date.now() + 50 }),
      {
        ack: () => Promise.reject(blip),
        deadLetter: async () => {},
      },
    );
    expect(failing).toEqual({ id: 'job-1', key: 'w', reason: 'settle-failed', error: blip });
  });

  test("the runtime's methods work destructured (a wrapper may pass them around)", async () => {
    const events: string[] = [];
    const { settleInWorker, decide, settledEvent, report } = runtimeWith({
      onSettled: (e) => void events.push(`${e.action}:${e.reason}`),
    });
    const acked: unknown[] = [];
    const verbs: WorkerVerbs = { ack: async (result) => void acked.push(result), deadLetter: async () => {} };
    expect(await settleInWorker({ id: 'd', body: 'x' }, delivery(), verbs)).toBeUndefined();
    expect(acked).toEqual([undefined]);
    expect(events).toEqual(['ack:executed']);
    const decision = await decide({ id: 'd', body: 'x' }, 0);
    expect(decision.settlement).toEqual({ action: 'ack', reason: 'replayed' });
    report(settledEvent({ id: 'd', body: 'x' }, 'd', decision.settlement, 0));
    expect(events).toEqual(['ack:executed', 'ack:replayed']);
  });
});

describe('consumerRuntime: what the work throws is the work failing, whatever its class', () => {
  test("an inner call's in-progress or unstorable error fails the work (retry), never delays or acks it", async () => {
    const runtime = runtimeWith({ maxAttempts: 3 });
    const inner = [
      new IdempotencyInProgressError('inner-key', 1000),
      new UnstorableResultError('inner-key', 'the result is undefined', false),
    ];
    for (const [i, error] of inner.entries()) {
      const decision = await runtime.decide({ id: `w${i}`, body: 'x' }, 0, () => {
        throw error;
      });
      expect(decision.settlement).toMatchObject({ action: 'retry', reason: 'failed', failures: 1, error });
    }
    // The key was released: the next delivery runs the work again.
    let runs = 0;
    const again = await runtime.decide({ id: 'w0', body: 'x' }, 1, () => {
      runs++;
    });
    expect(again.settlement).toEqual({ action: 'ack', reason: 'executed' });
    expect(runs).toBe(1);
  });

  test('an async onSettled that rejects is logged, not an unhandled rejection', async () => {
    const errors: string[] = [];
    const logger = {
      error: (_o: object, msg: string) => void errors.push(msg),
      warn() {},
      info() {},
      debug() {},
    };
    const runtime = runtimeWith({
      logger,
      onSettled: async () => {
        throw new Error('metrics backend down');
      },
    });
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => void unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      const decision = await runtime.decide({ id: 'o1', body: 'x' }, 0);
      runtime.report(runtime.settledEvent({ id: 'o1', body: 'x' }, 'o1', decision.settlement, 0));
      await new Promise((resolve) => setTimeout(resolve, 20));
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
    expect(unhandled).toEqual([]);
    expect(errors).toContain('oncely: onSettled rejected; ignored');
  });
});

describe('without a logger, what the user must see is a process warning, once per kind', () => {
  const warningsOf = (emitWarning: jest.SpyInstance, code: string): string[] =>
    emitWarning.mock.calls
      .filter((call) => (call[1] as { code?: string } | undefined)?.code === code)
      .map((call) => String(call[0]));

  test("messages run unprotected (onMissingKey: 'process') and a hook that throws", async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    try {
      const runtime = runtimeWith({
        onMissingKey: 'process',
        hooks: {
          onExecutionStart: () => {
            throw new Error('metrics client not started');
          },
        },
      });
      for (let i = 0; i < 3; i++) await runtime.decide({ body: 'x' }, 0, () => {});
      for (const id of ['m1', 'm2']) await runtime.decide({ id, body: 'x' }, 0, () => {});
      expect(warningsOf(emitWarning, 'ONCELY_MESSAGE_WITHOUT_KEY')).toEqual([
        expect.stringMatching(/WITHOUT protection \(onMissingKey: 'process'\)/),
      ]);
      expect(warningsOf(emitWarning, 'ONCELY_HOOK_THREW')).toEqual([
        expect.stringMatching(/onExecutionStart hook threw \(metrics client not started\)/),
      ]);
    } finally {
      emitWarning.mockRestore();
    }
  });
});
