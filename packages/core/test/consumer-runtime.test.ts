import {
  type ConsumerOptions,
  consumerRuntime,
  IdempotencyOptionsError,
  MemoryStore,
  PermanentError,
} from '../src';

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
