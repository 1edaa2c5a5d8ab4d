/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import {
  type Duration,
  type FencedEvent,
  Idempotency,
  type IdempotencyStore,
  type Logger,
  MemoryStore,
} from '@oncely/core';
import {
  type ConsumerOptions,
  consumerRuntime,
  type HttpDecision,
  type HttpRequestInput,
  type IdempotencyRecord,
  type LeaseSettings,
} from '@oncely/core/adapter';
import { RedisStore } from '@oncely/redis';
import { CLIENT_KINDS, type ConnectedClient } from '../../redis/test/clients';

// Per-call lease settings (a platform's deadline, a heartbeat to extend something with each renewal), on the HTTP
// engine's path and on the consumer runtime's, with MemoryStore and with a RedisStore on the machine's shared Redis
// (a random prefix, never flushed: the keys used are deleted afterwards).

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test:lease:${randomUUID()}:`;

type InspectableStore = IdempotencyStore & {
  get(key: string): Promise<IdempotencyRecord | undefined>;
  delete(key: string): Promise<boolean>;
};

let redis: ConnectedClient | undefined;
const used: { store: InspectableStore; key: string }[] = [];

const STORES: [string, () => Promise<InspectableStore>][] = [
  ['MemoryStore', async () => new MemoryStore()],
  [
    'RedisStore',
    async () => {
      redis ??= await (CLIENT_KINDS[0] as (typeof CLIENT_KINDS)[number]).standalone(url);
      return new RedisStore({ client: redis.client, prefix });
    },
  ],
];

afterAll(async () => {
  for (const { store, key } of used) await store.delete(key);
  await redis?.close();
});

/** How late a store may see a write under load: its lease is measured from when it arrives. */
const SLACK = 250;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** Sleeps until `Date.now()` is past `time`. */
const until = (time: number) => sleep(Math.max(0, time - Date.now() + 1));

/** A logger keeping its error lines. */
function recordingLogger(): Logger & { errors: string[] } {
  const errors: string[] = [];
  const noop = () => {};
  return { debug: noop, info: noop, warn: noop, error: (_obj, msg) => errors.push(msg ?? ''), errors };
}

const ok = (id: number) => ({
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: Buffer.from(`{"id":${id}}`),
});

function input(key: string, lease?: LeaseSettings): HttpRequestInput<unknown> {
  return {
    method: 'POST',
    url: '/charges',
    headers: { 'idempotency-key': key },
    body: { a: 1 },
    request: {},
    ...(lease === undefined ? {} : { lease }),
  };
}

function expectExecute(decision: HttpDecision) {
  if (decision.action !== 'execute') {
    throw new Error(
      `expected execute, got ${decision.action} ${decision.action === 'respond' ? decision.response.status : ''}`,
    );
  }
  return decision.execution;
}

function expectStatus(decision: HttpDecision, status: number) {
  if (decision.action !== 'respond') throw new Error(`expected a ${status} answer, got ${decision.action}`);
  expect(decision.response.status).toBe(status);
  return decision.response;
}

/** An engine on `store` keeping the fenced writes it reports. */
function fencedEngine(store: IdempotencyStore, lockTimeout: Duration) {
  const fenced: FencedEvent[] = [];
  const engine = new Idempotency({ store, lockTimeout, hooks: { onFenced: (event) => fenced.push(event) } });
  return { engine, fenced };
}

/** Polls until `done()` (for at most 2s). */
async function eventually(done: () => boolean): Promise<void> {
  for (let i = 0; i < 100 && !done(); i++) await sleep(20);
}

/** The lease end of the key's in-progress record. */
async function leaseEnd(store: InspectableStore, key: string): Promise<number> {
  const record = await store.get(key);
  expect(record?.state).toBe('in_progress');
  return (record as IdempotencyRecord).lockExpiresAt;
}

interface Message {
  id: string;
  body: string;
}

const broker = {
  name: '@oncely/test-broker',
  options: [],
  keyOf: (msg: Message) => msg.id,
  fingerprint: (msg: Message) => msg.body,
};

describe.each(STORES)('per-call lease settings on %s', (_name, createStore) => {
  let store: InspectableStore;
  beforeAll(async () => {
    store = await createStore();
  });
  const newKey = () => {
    const key = `lease-${randomUUID()}`;
    used.push({ store, key });
    return key;
  };

  describe('HTTP engine', () => {
    test('endsAt caps the acquire: a retry after it takes the key over, and the first completion is fenced', async () => {
      const { engine, fenced } = fencedEngine(store, '30s');
      const key = newKey();
      const endsAt = Date.now() + 1500;
      const first = expectExecute(await engine.handle(input(key, { endsAt })));
      expect(await leaseEnd(store, key)).toBeLessThanOrEqual(endsAt + SLACK);
      // Without lease settings the lease is lockTimeout, as before.
      const plainKey = newKey();
      const plainStart = Date.now();
      const plain = expectExecute(await engine.handle(input(plainKey)));
      expect(await leaseEnd(store, plainKey)).toBeGreaterThanOrEqual(plainStart + 29_000);
      await plain.complete(ok(0));

      // Until endsAt the key is held.
      expectStatus(await engine.handle(input(key)), 409);
      await until(endsAt + SLACK);
      const second = expectExecute(await engine.handle(input(key)));
      expect(await first.complete(ok(1))).toBeUndefined();
      expect(fenced).toEqual([expect.objectContaining({ key, operation: 'complete' })]);
      await second.complete(ok(2));
      const replay = expectStatus(await engine.handle(input(key)), 201);
      expect(Buffer.from(replay.body).toString()).toBe('{"id":2}');
    });

    test('an endsAt already past still writes a lease of the floor (1s), never one a duplicate runs beside', async () => {
      const engine = new Idempotency({ store, lockTimeout: '30s' });
      const key = newKey();
      const start = Date.now();
      const first = expectExecute(await engine.handle(input(key, { endsAt: start - 60_000 })));
      const end = await leaseEnd(store, key);
      expect(end).toBeGreaterThanOrEqual(start + 1000);
      expect(end).toBeLessThanOrEqual(Date.now() + 1000);
      expectStatus(await engine.handle(input(key)), 409);
      await until(end + 50);
      const second = expectExecute(await engine.handle(input(key)));
      await first.complete(ok(1));
      await second.complete(ok(2));
      // An endsAt that is not a number (an adapter's arithmetic on a missing value) leaves the lease at lockTimeout.
      const nanKey = newKey();
      const nanStart = Date.now();
      const nan = expectExecute(await engine.handle(input(nanKey, { endsAt: Number.NaN })));
      expect(await leaseEnd(store, nanKey)).toBeGreaterThanOrEqual(nanStart + 29_000);
      await nan.complete(ok(3));
    });

    test('renewals are capped by endsAt and followed by onRenewed; after endsAt the key is taken over', async () => {
      // A 3 s lease renewed every second: a loaded machine would have to hold a renewal back 2 s to lapse it.
      const { engine, fenced } = fencedEngine(store, '3000ms');
      const key = newKey();
      const endsAt = Date.now() + 5000;
      let renewed = 0;
      const first = expectExecute(
        await engine.handle(input(key, { endsAt, onRenewed: () => void renewed++ })),
      );
      // Without the cap, the lease would now end 3 s after the last renewal, past endsAt.
      await until(endsAt - 1200);
      expect(renewed).toBeGreaterThanOrEqual(2);
      expect(await leaseEnd(store, key)).toBeLessThanOrEqual(endsAt + SLACK);
      await until(endsAt + SLACK);
      const second = expectExecute(await engine.handle(input(key)));
      const before = renewed;
      await first.complete(ok(1));
      expect(fenced).toEqual([expect.objectContaining({ key, operation: 'complete' })]);
      await sleep(700);
      expect(renewed).toBe(before);
      await second.complete(ok(2));
    });

    test('onRenewed: not after a renewal the store refused, nor after the execution ended', async () => {
      const { engine, fenced } = fencedEngine(store, '300ms');
      // Refused: the record is gone, so the next renewal is fenced and renewing ends.
      const key = newKey();
      let renewed = 0;
      const first = expectExecute(await engine.handle(input(key, { onRenewed: () => void renewed++ })));
      await eventually(() => renewed > 0);
      expect(renewed).toBeGreaterThanOrEqual(1);
      await store.delete(key);
      await eventually(() => fenced.length > 0);
      expect(fenced).toEqual([expect.objectContaining({ key, operation: 'renew' })]);
      const afterFenced = renewed;
      await sleep(400);
      expect(renewed).toBe(afterFenced);
      await first.complete(ok(1));

      // Ended while a renewal the store accepts is on its way: no onRenewed for it.
      let releaseRenewal!: () => void;
      const gate = new Promise<void>((resolve) => {
        releaseRenewal = resolve;
      });
      let renewing = 0;
      const slowRenewals = new Proxy(store, {
        get(target, name, receiver) {
          if (name !== 'renew') {
            const value = Reflect.get(target, name, receiver);
            return typeof value === 'function' ? value.bind(target) : value;
          }
          return async (k: string, token: string, ms: number) => {
            renewing++;
            const answer = await target.renew(k, token, ms);
            await gate;
            return answer;
          };
        },
      });
      const slowEngine = new Idempotency({ store: slowRenewals, lockTimeout: '300ms' });
      const slowKey = newKey();
      let slowRenewed = 0;
      const slow = expectExecute(
        await slowEngine.handle(input(slowKey, { onRenewed: () => void slowRenewed++ })),
      );
      await eventually(() => renewing > 0);
      expect(renewing).toBe(1);
      await slow.complete(ok(3));
      releaseRenewal();
      await sleep(50);
      expect(slowRenewed).toBe(0);
      const replay = expectStatus(await slowEngine.handle(input(slowKey)), 201);
      expect(Buffer.from(replay.body).toString()).toBe('{"id":3}');
    });

    test('an onRenewed that throws or rejects is logged and ignored: renewals go on, the response is stored', async () => {
      const logger = recordingLogger();
      const unhandled: unknown[] = [];
      const onUnhandled = (reason: unknown) => unhandled.push(reason);
      process.on('unhandledRejection', onUnhandled);
      try {
        const engine = new Idempotency({ store, lockTimeout: '300ms', logger });
        const key = newKey();
        let calls = 0;
        const onRenewed = () => {
          calls++;
          if (calls % 2 === 1) throw new Error('visibility extension failed');
          return Promise.reject(new Error('visibility extension rejected'));
        };
        const first = expectExecute(await engine.handle(input(key, { onRenewed })));
        await eventually(() => calls >= 4);
        expect(calls).toBeGreaterThanOrEqual(4);
        await first.complete(ok(1));
        await sleep(20);
        expect(logger.errors).toEqual(
          expect.arrayContaining(['oncely: onRenewed threw; ignored', 'oncely: onRenewed rejected; ignored']),
        );
        expect(unhandled).toEqual([]);
        const replay = expectStatus(await engine.handle(input(key)), 201);
        expect(Buffer.from(replay.body).toString()).toBe('{"id":1}');
      } finally {
        process.off('unhandledRejection', onUnhandled);
      }
    });
  });

  describe('consumer runtime', () => {
    test('endsAt caps the acquire: a redelivery after it takes the key over, and the first completion is fenced', async () => {
      const fenced: FencedEvent[] = [];
      const options: ConsumerOptions<Message> = {
        store,
        lockTimeout: '30s',
        inProgressDelay: '1s',
        hooks: { onFenced: (event) => fenced.push(event) },
      };
      const runtime = consumerRuntime<Message>(() => {}, options, broker);
      const msg = { id: newKey(), body: 'x' };
      let finishFirst!: () => void;
      let started = false;
      const endsAt = Date.now() + 1500;
      const first = runtime.decide(
        msg,
        0,
        () =>
          new Promise<void>((resolve) => {
            started = true;
            finishFirst = resolve;
          }),
        { endsAt },
      );
      await eventually(() => started);
      expect(await leaseEnd(store, msg.id)).toBeLessThanOrEqual(endsAt + SLACK);
      let runs = 0;
      const work = () => {
        runs++;
      };
      expect((await runtime.decide(msg, 0, work)).settlement).toMatchObject({ action: 'delay' });
      await until(endsAt + SLACK);
      expect((await runtime.decide(msg, 0, work)).settlement).toEqual({ action: 'ack', reason: 'executed' });
      expect(runs).toBe(1);
      finishFirst();
      await first;
      expect(fenced).toEqual([expect.objectContaining({ key: msg.id, operation: 'complete' })]);
    });

    test('renewals are capped by endsAt and followed by onRenewed; a throwing onRenewed is ignored', async () => {
      const logger = recordingLogger();
      const runtime = consumerRuntime<Message>(
        () => {},
        { store, lockTimeout: '1500ms', inProgressDelay: '1s', logger },
        broker,
      );
      const msg = { id: newKey(), body: 'x' };
      let finishFirst!: () => void;
      const endsAt = Date.now() + 2500;
      let renewed = 0;
      const first = runtime.decide(msg, 0, () => new Promise<void>((resolve) => (finishFirst = resolve)), {
        endsAt,
        onRenewed: () => {
          renewed++;
          throw new Error('heartbeat failed');
        },
      });
      await until(endsAt - 600);
      expect(renewed).toBeGreaterThanOrEqual(2);
      expect(logger.errors).toContain('oncely: onRenewed threw; ignored');
      expect(await leaseEnd(store, msg.id)).toBeLessThanOrEqual(endsAt + SLACK);
      await until(endsAt + SLACK);
      let runs = 0;
      expect(
        (
          await runtime.decide(msg, 0, () => {
            runs++;
          })
        ).settlement,
      ).toEqual({ action: 'ack', reason: 'executed' });
      expect(runs).toBe(1);
      finishFirst();
      expect((await first).settlement.action).toBe('ack');
    });
  });
});
