import { currentIdempotency, idempotent, MemoryStore } from '@oncely/core';
import { otel, otelHooks } from '@oncely/opentelemetry';
import { context, trace } from '@opentelemetry/api';
import { telemetry } from './helpers';

// oncely.steps counts the steps of executions by outcome (run, replayed) and adapter kind, from the onStep hook.
// The step's name never becomes an attribute: code may build names from data, a series per name.

const t = telemetry();
afterAll(() => t.shutdown());

async function steps(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const p of (await t.metrics()).get('oncely.steps') ?? []) {
    out[`${p.attributes['oncely.adapter']}:${p.attributes['oncely.step.outcome']}`] = p.value as number;
  }
  return out;
}

test('oncely.steps counts steps by outcome and adapter, both outcomes once a kind stepped', async () => {
  const hooks = otelHooks({ meterProvider: t.meterProvider });
  expect(await steps()).toEqual({});
  hooks.onStep?.({ adapter: 'http', key: 'SECRET-key', name: 'SECRET-order', outcome: 'run' });
  hooks.onStep?.({ adapter: 'http', key: 'SECRET-key', name: 'SECRET-charge', outcome: 'run' });
  expect(await steps()).toEqual({ 'http:run': 2, 'http:replayed': 0 });
  hooks.onStep?.({ adapter: 'http', key: 'SECRET-key', name: 'SECRET-order', outcome: 'replayed' });
  hooks.onStep?.({ adapter: 'consumer', key: 'SECRET-m', name: 'SECRET-send', outcome: 'replayed' });
  expect(await steps()).toEqual({
    'http:run': 2,
    'http:replayed': 1,
    'consumer:run': 0,
    'consumer:replayed': 1,
  });
  // A second otel() on the same meter provider shares the counts.
  otelHooks({ meterProvider: t.meterProvider }).onStep?.({
    adapter: 'consumer',
    key: 'k',
    name: 'n',
    outcome: 'run',
  });
  expect((await steps())['consumer:run']).toBe(1);
  expect((await t.everyAttributeValue()).filter((v) => v.includes('SECRET'))).toEqual([]);
});

test('a step adds the oncely.step event, with its outcome only, to the active span', async () => {
  const hooks = otelHooks({ meterProvider: t.meterProvider, tracerProvider: t.tracerProvider });
  const span = trace.getTracer('test').startSpan('POST');
  context.with(trace.setSpan(context.active(), span), () => {
    hooks.onStep?.({ adapter: 'http', key: 'SECRET-key', name: 'SECRET-charge', outcome: 'run' });
    hooks.onStep?.({ adapter: 'http', key: 'SECRET-key', name: 'SECRET-email', outcome: 'replayed' });
  });
  span.end();
  const ended = t.spans().find((s) => s.name === 'POST');
  expect(ended?.events.map((e) => [e.name, e.attributes])).toEqual([
    ['oncely.step', { 'oncely.step.outcome': 'run' }],
    ['oncely.step', { 'oncely.step.outcome': 'replayed' }],
  ]);
});

test('a recordStep store operation is timed under its own operation', async () => {
  const hooks = otelHooks({ meterProvider: t.meterProvider });
  const event = { adapter: 'http', store: 'MemoryStore', key: 'SECRET-key', durationMs: 0.2 } as const;
  hooks.onStoreOperation?.({ ...event, operation: 'recordStep', result: 'ok' });
  hooks.onStoreOperation?.({ ...event, operation: 'recordStep', result: 'error', errorType: 'ReplyError' });
  const ops = await t.storeOperations();
  expect(ops['recordStep:ok']).toBe(1);
  expect(ops['recordStep:error']).toBe(1);
});

test('metrics: false counts no steps', async () => {
  const before = await steps();
  otelHooks({ meterProvider: t.meterProvider, metrics: false }).onStep?.({
    adapter: 'http',
    key: 'k',
    name: 'n',
    outcome: 'run',
  });
  expect(await steps()).toEqual(before);
});

test('through idempotent(): a failed attempt runs two steps, its retry replays them and runs the third', async () => {
  const before = await steps();
  const at = (id: string) => before[id] ?? 0;
  const store = new MemoryStore();
  let failAfterCharge = true;
  let charges = 0;
  const order = idempotent(
    async (id: string) => {
      const ctx = currentIdempotency();
      if (ctx === undefined) throw new Error('no context');
      await ctx.step('order', () => ({ id }));
      const charge = await ctx.step('charge', () => ({ chargeId: `ch_${++charges}` }));
      if (failAfterCharge) throw new Error('failed between the charge and the email');
      await ctx.step('email', () => undefined);
      return charge;
    },
    { store, key: (id) => `SECRET-${id}`, ...otel({ meterProvider: t.meterProvider }) },
  );
  await expect(order('o-1')).rejects.toThrow('between the charge');
  failAfterCharge = false;
  expect(await order('o-1')).toEqual({ chargeId: 'ch_1' });
  expect(charges).toBe(1);
  const after = await steps();
  expect(after['consumer:run']).toBe(at('consumer:run') + 3);
  expect(after['consumer:replayed']).toBe(at('consumer:replayed') + 2);
  expect((await t.storeOperations())['recordStep:ok']).toBeGreaterThanOrEqual(3);
  expect((await t.everyAttributeValue()).filter((v) => v.includes('SECRET'))).toEqual([]);
  await store.close();
});
