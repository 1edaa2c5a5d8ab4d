import {
  composeHooks,
  type DecisionEvent,
  Idempotency,
  idempotent,
  MemoryStore,
  type StoredResponse,
  type StoreOperationEvent,
} from '@oncely/core';
import { type AcquireOptions, OBSERVERS } from '@oncely/core/adapter';
import { hooksOf, hooksOver, type ObservableOptions } from '../src/shared/observe';

// OBSERVERS from the built package and ObservableOptions from the source are two declarations of one symbol.
const observable = (o: object) => o as ObservableOptions;

const input = (key: string, headers: Record<string, string> = {}) => ({
  method: 'POST',
  url: '/x',
  headers: { 'idempotency-key': key, ...headers },
  body: { a: 1 },
  request: {},
});
const response = { status: 201, headers: {}, body: new Uint8Array() };

test('without a timing hook the engine calls the store itself (no wrapper, no clock on the hot path)', () => {
  const store = new MemoryStore();
  expect(new Idempotency({ store, hooks: { onHit() {} } }).observedStore).toBe(store);
  expect(new Idempotency({ store, hooks: { onStoreOperation() {} } }).observedStore).not.toBe(store);
  void store.close();
});

test('hooks given as a class instance: its methods are called, with the instance as this (here and beside otel-style observers)', async () => {
  class Counting {
    readonly seen: string[] = [];
    onMiss() {
      this.seen.push('miss');
    }
    onDecision(event: DecisionEvent) {
      this.seen.push(`decision:${event.outcome}`);
    }
  }
  const alone = new Counting();
  const composed = new Counting();
  const observed: string[] = [];
  const store = new MemoryStore();
  for (const options of [
    { store, hooks: alone },
    { store, hooks: composed, [OBSERVERS]: [{ onDecision: () => void observed.push('observer') }] },
  ]) {
    const engine = new Idempotency(options);
    const decision = await engine.handle(input(`class-${options.hooks === alone ? 1 : 2}`));
    if (decision.action !== 'execute') throw new Error('expected execute');
    await decision.execution.complete(response);
  }
  expect(alone.seen).toEqual(['miss', 'decision:executed']);
  expect(composed.seen).toEqual(['miss', 'decision:executed']);
  expect(observed).toEqual(['observer']);
  class Broken {
    get onHit() {
      return 'not a function';
    }
  }
  expect(() => new Idempotency({ store, hooks: new Broken() as never })).toThrow(
    /option "hooks.onHit" must be a function/,
  );
  await store.close();
});

test('onDecision, onStoreOperation and onExecutionStart/End report one request', async () => {
  const store = new MemoryStore();
  const events: string[] = [];
  const ops: StoreOperationEvent[] = [];
  const engine = new Idempotency({
    store,
    hooks: {
      onDecision: (e: DecisionEvent) => void events.push(`decision:${e.outcome}`),
      onStoreOperation: (e) => void ops.push(e),
      onExecutionStart: () => void events.push('start'),
      onExecutionEnd: () => void events.push('end'),
    },
  });
  const d = await engine.handle(input('a'));
  if (d.action !== 'execute') throw new Error('expected execute');
  await d.execution.complete(response);
  await engine.handle(input('a'));
  await engine.handle({ ...input('a'), body: { a: 2 } });
  expect(events).toEqual(['decision:executed', 'start', 'end', 'decision:replayed', 'decision:mismatch']);
  expect(ops.map((o) => `${o.operation}:${o.result}:${o.store}:${o.adapter}`)).toEqual([
    'acquire:ok:MemoryStore:http',
    'complete:ok:MemoryStore:http',
    'acquire:ok:MemoryStore:http',
    'acquire:ok:MemoryStore:http',
  ]);
  for (const o of ops) {
    expect(o.durationMs).toBeGreaterThanOrEqual(0);
    expect(o.errorType).toBeUndefined();
  }
  await store.close();
});

test("a failed store operation's event names what the store threw: its class, or _OTHER", async () => {
  class ConnectionLost extends Error {}
  const hostile = new Proxy(
    {},
    {
      getPrototypeOf() {
        throw new Error('trap');
      },
    },
  );
  const throwingGetter = Object.create({
    get constructor() {
      throw new Error('getter');
    },
  });
  const thrown: unknown[] = [
    new ConnectionLost('gone'),
    new TypeError('bad'),
    'a string',
    { code: 1 },
    // Data, not a class: an own `constructor` (a parsed JSON body thrown as it is) never becomes the label.
    JSON.parse('{"constructor":{"name":"UserSecret"}}'),
    hostile,
    throwingGetter,
  ];
  const errors: unknown[] = [];
  const store = new MemoryStore();
  const ops: StoreOperationEvent[] = [];
  const engine = new Idempotency({
    store: Object.assign(store, { acquire: () => Promise.reject(thrown.shift()) }),
    hooks: {
      onStoreOperation: (e) => void ops.push(e),
      onStoreError: (e) => void errors.push(e.error),
    },
  });
  const expectedErrors = [...thrown];
  for (let i = 0; i < 7; i++) expect((await engine.handle(input(`f${i}`))).action).toBe('respond');
  expect(ops.map((o) => `${o.operation}:${o.result}:${o.errorType}`)).toEqual([
    'acquire:error:ConnectionLost',
    'acquire:error:TypeError',
    'acquire:error:_OTHER',
    'acquire:error:_OTHER',
    'acquire:error:_OTHER',
    'acquire:error:_OTHER',
    'acquire:error:_OTHER',
  ]);
  // What the store threw is what the hooks see, whatever reading its class did.
  expect(errors).toHaveLength(7);
  for (const [i, error] of errors.entries()) expect(error).toBe(expectedErrors[i]);
  await store.close();
});

test('wait mode reports how long the request waited', async () => {
  const store = new MemoryStore();
  const decisions: DecisionEvent[] = [];
  const engine = new Idempotency({
    store,
    inProgress: { wait: '2s' },
    hooks: { onDecision: (e) => void decisions.push(e) },
  });
  const first = await engine.handle(input('w'));
  if (first.action !== 'execute') throw new Error('expected execute');
  const second = engine.handle(input('w'));
  await new Promise((r) => setTimeout(r, 120));
  await first.execution.complete(response);
  expect((await second).action).toBe('respond');
  expect(decisions[0]?.waitedMs).toBeUndefined();
  expect(decisions[1]?.outcome).toBe('replayed');
  expect(decisions[1]?.waitedMs).toBeGreaterThanOrEqual(100);
  await store.close();
});

test('a missing or malformed key is a rejected decision without a key', async () => {
  const decisions: DecisionEvent[] = [];
  const engine = new Idempotency({ required: true, hooks: { onDecision: (e) => void decisions.push(e) } });
  await engine.handle({ ...input('x'), headers: {} });
  await engine.handle(input('x'.repeat(300)));
  expect(decisions).toEqual([
    { adapter: 'http', outcome: 'rejected' },
    { adapter: 'http', outcome: 'rejected' },
  ]);
});

test('composeHooks runs every hook even when one throws, then re-throws the first error', () => {
  const calls: string[] = [];
  const hooks = composeHooks(
    {
      onHit: () => {
        calls.push('a');
        throw new Error('a');
      },
    },
    undefined,
    { onHit: () => void calls.push('b'), onMiss: () => void calls.push('miss') },
  );
  expect(() => hooks.onHit?.({ key: 'k' })).toThrow('a');
  hooks.onMiss?.({ key: 'k' });
  expect(calls).toEqual(['a', 'b', 'miss']);
});

test('idempotent() reports decisions, executions, releases and store operations as the consumer kind', async () => {
  const store = new MemoryStore();
  const seen: string[] = [];
  let fail = true;
  const fn = idempotent(
    async (_id: string) => {
      if (fail) {
        fail = false;
        throw new Error('transient');
      }
      return 1;
    },
    {
      store,
      key: (id: string) => id,
      hooks: {
        onDecision: (e) => void seen.push(`${e.adapter}:${e.outcome}`),
        onRelease: (e) => void seen.push(`release:${e.adapter}`),
        onExecutionStart: () => void seen.push('start'),
        onExecutionEnd: () => void seen.push('end'),
        onComplete: () => void seen.push('complete'),
        onStoreOperation: (e) => void seen.push(`op:${e.operation}`),
      },
    },
  );
  await expect(fn('k')).rejects.toThrow('transient');
  await fn('k');
  await fn('k');
  await expect(fn('')).rejects.toThrow();
  expect(seen).toEqual([
    'op:acquire',
    'consumer:executed',
    'start',
    'op:release',
    'release:consumer',
    'end',
    'op:acquire',
    'consumer:executed',
    'start',
    'op:complete',
    'complete',
    'end',
    'op:acquire',
    'consumer:replayed',
    'consumer:rejected',
  ]);
  await store.close();
});

test('transactional mode: commit and rollback are timed as complete and release; the transaction keeps its db and this', async () => {
  class Transaction {
    readonly #db = { name: 'db' };
    readonly #store: MemoryStore;
    readonly #key: string;
    readonly #token: string;
    constructor(store: MemoryStore, key: string, token: string) {
      this.#store = store;
      this.#key = key;
      this.#token = token;
    }
    get db() {
      return this.#db;
    }
    commit(response: StoredResponse, ttlMs: number) {
      return this.#store.complete(this.#key, this.#token, response, ttlMs);
    }
    async rollback() {
      await this.#store.release(this.#key, this.#token);
    }
  }
  class TransactionalStore extends MemoryStore {
    async acquireInTransaction(key: string, options: AcquireOptions) {
      const result = await this.acquire(key, options);
      return result.status === 'acquired'
        ? { ...result, transaction: new Transaction(this, key, result.token) }
        : result;
    }
  }
  const store = new TransactionalStore();
  const ops: string[] = [];
  const engine = new Idempotency({
    store,
    transactional: true,
    hooks: { onStoreOperation: (e) => void ops.push(`${e.operation}:${e.result}:${e.store}`) },
  });
  const d = await engine.handle(input('tx'));
  if (d.action !== 'execute') throw new Error('expected execute');
  expect(d.execution.db).toEqual({ name: 'db' });
  expect(await d.execution.complete(response)).toBeUndefined();
  const again = await engine.handle(input('tx'));
  expect(again.action === 'respond' && again.replayed).toBe(true);
  const other = await engine.handle(input('tx-2'));
  if (other.action !== 'execute') throw new Error('expected execute');
  await other.execution.fail(new Error('boom'));
  expect(ops).toEqual([
    'acquire:ok:TransactionalStore',
    'complete:ok:TransactionalStore',
    'acquire:ok:TransactionalStore',
    'acquire:ok:TransactionalStore',
    'release:ok:TransactionalStore',
  ]);
  expect(await store.get('tx-2')).toBeUndefined();
  await store.close();
});

test("hooksOver: options over a base replace only the part they set (a route's hooks keep its plugin's observers)", () => {
  const calls: string[] = [];
  const mine = { onHit: () => void calls.push('plugin-hooks') };
  const observer = { onHit: () => void calls.push('plugin-otel') };
  const base = hooksOf(observable({ hooks: mine, [OBSERVERS]: [observer] }));
  expect(hooksOver({}, base)).toBe(base);
  hooksOver({ hooks: { onHit: () => void calls.push('route-hooks') } }, base)?.onHit?.({ key: 'k' });
  expect(calls).toEqual(['route-hooks', 'plugin-otel']);
  calls.length = 0;
  hooksOver(observable({ [OBSERVERS]: [{ onHit: () => void calls.push('route-otel') }] }), base)?.onHit?.({
    key: 'k',
  });
  expect(calls).toEqual(['plugin-hooks', 'route-otel']);
  calls.length = 0;
  // A base made elsewhere (no parts known) counts as own hooks.
  hooksOver(observable({ [OBSERVERS]: [observer] }), { onHit: () => void calls.push('plain') })?.onHit?.({
    key: 'k',
  });
  expect(calls).toEqual(['plain', 'plugin-otel']);
});
