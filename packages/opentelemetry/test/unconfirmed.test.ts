import {
  Idempotency,
  idempotent,
  MemoryStore,
  type StoredResponse,
  type UnconfirmedWriteOutcome,
} from '@oncely/core';
import { otel } from '@oncely/opentelemetry';
import { telemetry } from './helpers';

// Writes a store could not confirm (RedisStore's waitForReplicas) are counted once when they open
// (oncely.store.unconfirmed_writes) and once by how they ended (oncely.store.unconfirmed_writes.ended), so that
// neither counter counts a write twice.

const t = telemetry();
afterAll(() => t.shutdown());

/** Completes and releases, then reports each write unconfirmed, its confirmation settled by the test. */
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

async function unconfirmedWrites(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  const metrics = await t.metrics();
  for (const name of ['oncely.store.unconfirmed_writes', 'oncely.store.unconfirmed_writes.ended']) {
    for (const p of metrics.get(name) ?? []) {
      const a = p.attributes;
      const outcome = a['oncely.unconfirmed.outcome'];
      // The opening counter has no outcome; its points are named 'unconfirmed' here.
      if (name === 'oncely.store.unconfirmed_writes' && outcome !== undefined) throw new Error('an outcome');
      const id = `${a['oncely.adapter']}:${a['oncely.store.operation']}:${outcome ?? 'unconfirmed'}`;
      if ((p.value as number) > 0) out[id] = p.value as number;
    }
  }
  return out;
}

test('oncely.store.unconfirmed_writes counts unconfirmed completions and releases, .ended how each ended', async () => {
  expect(await unconfirmedWrites()).toEqual({});
  const store = new UnconfirmedStore();
  const engine = new Idempotency({ store, ...otel({ meterProvider: t.meterProvider }) });
  const input = (key: string) => ({
    method: 'POST',
    url: '/x',
    headers: { 'idempotency-key': key },
    body: {},
    request: {},
  });
  for (const [key, status] of [
    ['a', 201],
    ['b', 201],
    ['c', 500],
    ['d', 201],
  ] as const) {
    const decision = await engine.handle(input(key));
    if (decision.action !== 'execute') throw new Error('expected execute');
    await decision.execution.complete({ status, headers: {}, body: Buffer.from('x') });
  }
  const handle = idempotent(async (id: string) => id, {
    store,
    key: (id) => id,
    ...otel({ meterProvider: t.meterProvider }),
  });
  await handle('m');
  expect(await unconfirmedWrites()).toEqual({
    'http:complete:unconfirmed': 3,
    'http:release:unconfirmed': 1,
    'consumer:complete:unconfirmed': 1,
  });
  store.settle[0]?.('confirmed');
  store.settle[1]?.('lost');
  store.settle[2]?.('gave_up');
  store.settle[3]?.('expired');
  store.settle[4]?.('confirmed');
  await new Promise((resolve) => setImmediate(resolve));
  expect(await unconfirmedWrites()).toEqual({
    'http:complete:unconfirmed': 3,
    'http:complete:confirmed': 1,
    'http:complete:lost': 1,
    'http:complete:expired': 1,
    'http:release:unconfirmed': 1,
    'http:release:gave_up': 1,
    'consumer:complete:unconfirmed': 1,
    'consumer:complete:confirmed': 1,
  });
  await store.close();
});
