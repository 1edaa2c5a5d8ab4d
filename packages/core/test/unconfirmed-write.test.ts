import {
  Idempotency,
  idempotent,
  type Logger,
  MemoryStore,
  type StoredResponse,
  type UnconfirmedWriteEvent,
  type UnconfirmedWriteOutcome,
} from '@oncely/core';

// A store that writes, then reports the write unconfirmed with a confirmation still running, as RedisStore's
// waitForReplicas does when the replicas lag: the engine and idempotent() report it to onUnconfirmedWrite, now and
// when the confirmation ends, and log how it ended.
class UnconfirmedStore extends MemoryStore {
  readonly settle: ((outcome: UnconfirmedWriteOutcome) => void)[] = [];
  #unconfirmed(): Error {
    const confirmation = new Promise<UnconfirmedWriteOutcome>((resolve) => this.settle.push(resolve));
    return Object.assign(new Error('0 of 1 replica(s) confirmed'), { recordWritten: true, confirmation });
  }
  override async complete(key: string, token: string, response: StoredResponse, ttlMs: number) {
    if (!(await super.complete(key, token, response, ttlMs))) return false;
    throw this.#unconfirmed();
  }
  override async release(key: string, token: string) {
    if (!(await super.release(key, token))) return false;
    throw this.#unconfirmed();
  }
}

const input = (key: string) => ({
  method: 'POST',
  url: '/x',
  headers: { 'idempotency-key': key },
  body: { a: 1 },
  request: {},
});

function recordingLogger() {
  const lines: string[] = [];
  const at =
    (level: string) =>
    (_fields: object, message?: string): void =>
      void lines.push(`${level} ${message ?? ''}`);
  const logger: Logger = { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
  return { logger, lines };
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

test('http: an unconfirmed completion is reported when it opens and when it ends; the response is still sent and replayed', async () => {
  const store = new UnconfirmedStore();
  const events: UnconfirmedWriteEvent[] = [];
  const { logger, lines } = recordingLogger();
  const engine = new Idempotency({
    store,
    logger,
    hooks: { onUnconfirmedWrite: (e) => void events.push(e) },
  });
  const decision = await engine.handle(input('k1'));
  if (decision.action !== 'execute') throw new Error('expected execute');
  // No replacement: the captured response is sent as it is, since it is stored.
  expect(
    await decision.execution.complete({ status: 201, headers: {}, body: Buffer.from('ok') }),
  ).toBeUndefined();
  expect(events).toEqual([{ adapter: 'http', key: 'k1', operation: 'complete', outcome: 'unconfirmed' }]);
  expect(lines).toContain(
    'error oncely: the store could not confirm that its replicas have the response (not confirmed in time, or no reply); it re-sends it until they do',
  );
  store.settle[0]?.('confirmed');
  await flush();
  expect(events.map((e) => e.outcome)).toEqual(['unconfirmed', 'confirmed']);
  expect(lines).toContain('info oncely: the replicas confirmed the re-sent write');
  const replay = await engine.handle(input('k1'));
  expect(replay.action).toBe('respond');
  await store.close();
});

test('http: an unconfirmed release (a non-cacheable status) is reported, and a lost completion is logged as an error', async () => {
  const store = new UnconfirmedStore();
  const events: UnconfirmedWriteEvent[] = [];
  const { logger, lines } = recordingLogger();
  const engine = new Idempotency({
    store,
    logger,
    hooks: { onUnconfirmedWrite: (e) => void events.push(e) },
  });
  const released = await engine.handle(input('r1'));
  if (released.action !== 'execute') throw new Error('expected execute');
  await released.execution.complete({ status: 500, headers: {}, body: Buffer.from('no') });
  const completed = await engine.handle(input('c1'));
  if (completed.action !== 'execute') throw new Error('expected execute');
  await completed.execution.complete({ status: 201, headers: {}, body: Buffer.from('ok') });
  store.settle[0]?.('gave_up');
  store.settle[1]?.('lost');
  await flush();
  expect(events).toEqual([
    { adapter: 'http', key: 'r1', operation: 'release', outcome: 'unconfirmed' },
    { adapter: 'http', key: 'c1', operation: 'complete', outcome: 'unconfirmed' },
    { adapter: 'http', key: 'r1', operation: 'release', outcome: 'gave_up' },
    { adapter: 'http', key: 'c1', operation: 'complete', outcome: 'lost' },
  ]);
  expect(lines).toContain(
    'warn oncely: the release was never confirmed; the key frees itself when its lease ends',
  );
  expect(lines.some((l) => l.startsWith('error oncely: the unconfirmed response was lost'))).toBe(true);
  await store.close();
});

test('consumer: idempotent() reports unconfirmed completions and releases with the consumer kind', async () => {
  const store = new UnconfirmedStore();
  const events: UnconfirmedWriteEvent[] = [];
  const hooks = { onUnconfirmedWrite: (e: UnconfirmedWriteEvent) => void events.push(e) };
  const handle = idempotent(
    async (msg: { id: string; fail?: boolean }) => {
      if (msg.fail === true) throw new Error('transient');
      return { done: msg.id };
    },
    { store, key: (msg) => msg.id, hooks },
  );
  expect(await handle({ id: 'm1' })).toEqual({ done: 'm1' });
  await expect(handle({ id: 'm2', fail: true })).rejects.toThrow('transient');
  store.settle[0]?.('confirmed');
  store.settle[1]?.('confirmed');
  await flush();
  expect(events).toEqual([
    { adapter: 'consumer', key: 'm1', operation: 'complete', outcome: 'unconfirmed' },
    { adapter: 'consumer', key: 'm2', operation: 'release', outcome: 'unconfirmed' },
    { adapter: 'consumer', key: 'm1', operation: 'complete', outcome: 'confirmed' },
    { adapter: 'consumer', key: 'm2', operation: 'release', outcome: 'confirmed' },
  ]);
  await store.close();
});

test('a store error without a confirmation is not an unconfirmed write', async () => {
  const store = new MemoryStore();
  store.complete = async () => {
    throw Object.assign(new Error('written, not confirmed'), { recordWritten: true });
  };
  const events: UnconfirmedWriteEvent[] = [];
  const engine = new Idempotency({ store, hooks: { onUnconfirmedWrite: (e) => void events.push(e) } });
  const decision = await engine.handle(input('plain'));
  if (decision.action !== 'execute') throw new Error('expected execute');
  await decision.execution.complete({ status: 201, headers: {}, body: Buffer.from('ok') });
  expect(events).toEqual([]);
  await store.close();
});

test('a logger or a hook that throws when the confirmation ends does not become an unhandled rejection', async () => {
  const store = new UnconfirmedStore();
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => void unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  const throwing = () => {
    throw new Error('the logger is broken');
  };
  const logger: Logger = { debug() {}, info: throwing, warn: throwing, error() {} };
  const engine = new Idempotency({ store, logger });
  try {
    const decision = await engine.handle(input('t1'));
    if (decision.action !== 'execute') throw new Error('expected execute');
    await decision.execution.complete({ status: 201, headers: {}, body: Buffer.from('ok') });
    store.settle[0]?.('confirmed');
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(unhandled).toEqual([]);
  } finally {
    process.off('unhandledRejection', onUnhandled);
    await store.close();
  }
});

test("a release whose key is another's ends lost, logged as nothing left to release; an expired completion, as its ttl", async () => {
  const store = new UnconfirmedStore();
  const { logger, lines } = recordingLogger();
  const engine = new Idempotency({ store, logger });
  const released = await engine.handle(input('r2'));
  if (released.action !== 'execute') throw new Error('expected execute');
  await released.execution.complete({ status: 500, headers: {}, body: Buffer.from('no') });
  const completed = await engine.handle(input('c2'));
  if (completed.action !== 'execute') throw new Error('expected execute');
  await completed.execution.complete({ status: 201, headers: {}, body: Buffer.from('ok') });
  store.settle[0]?.('lost');
  store.settle[1]?.('expired');
  await flush();
  expect(lines).toContain(
    "info oncely: the re-sent release found the key no longer this execution's (another request holds it, or it completed): nothing left to release",
  );
  expect(lines).toContain(
    "info oncely: the unconfirmed response's ttl ran out before the replicas confirmed it",
  );
  expect(lines.some((l) => l.includes('was lost') || l.includes('stopped re-sending'))).toBe(false);
  await store.close();
});
