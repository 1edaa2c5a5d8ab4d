import { composeHooks, Idempotency, IdempotencyOptionsError, idempotent, MemoryStore } from '@oncely/core';
import { OBSERVERS } from '@oncely/core/adapter';
import { otel, otelHooks } from '@oncely/opentelemetry';
import { context, trace } from '@opentelemetry/api';
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';

// No tracer provider is registered in this file: the global API is the no-op one.

function meter() {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  return {
    meterProvider,
    async names() {
      await reader.forceFlush();
      return (exporter.getMetrics().at(-1)?.scopeMetrics ?? []).flatMap((s) =>
        s.metrics.map((m) => m.descriptor.name),
      );
    },
  };
}

const input = (key: string) => ({
  method: 'POST',
  url: '/x',
  headers: { 'idempotency-key': key },
  body: { a: 1 },
  request: {},
});

test('options mistakes are caught when otel() is called, naming the option', () => {
  expect(() => otel({ metrics: 'yes' as never })).toThrow(IdempotencyOptionsError);
  expect(() => otel({ metrics: 'yes' as never })).toThrow(/metrics/);
  expect(() => otel({ meterProvider: {} as never })).toThrow(/meterProvider/);
  expect(() => otel({ tracerProvider: 1 as never })).toThrow(/tracerProvider/);
  expect(() => otel({ exporter: true } as never)).toThrow(/exporter.*known options/);
  expect(() => otel({ hooks: 'x' as never })).toThrow(/hooks/);
});

test('no span is started when no tracer provider is registered, and none without a recording parent', async () => {
  const spanExporter = new InMemorySpanExporter();
  const real = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spanExporter)] });
  const getTracer = jest.fn((name: string, version?: string) => real.getTracer(name, version));
  const tracerProvider = { getTracer };
  // With nothing registered, the global tracer's spans do not record: there is never a parent to hang one on.
  const globalSpan = trace.getTracer('test').startSpan('request');
  expect(globalSpan.isRecording()).toBe(false);
  for (const [i, options] of [{}, { tracerProvider }].entries()) {
    const engine = new Idempotency({ ...otel(options) });
    await context.with(trace.setSpan(context.active(), globalSpan), async () => {
      const decision = await engine.handle(input(`k-${i}`));
      if (decision.action === 'execute')
        await decision.execution.complete({ status: 201, headers: {}, body: new Uint8Array() });
    });
  }
  expect(getTracer).not.toHaveBeenCalled();
  expect(spanExporter.getFinishedSpans()).toEqual([]);
});

test('user hooks and otel() compose in any spread order, with otelHooks() and with composeHooks()', async () => {
  const m = meter();
  const seen: string[] = [];
  const mine = { onMiss: () => void seen.push('miss'), onDecision: () => void seen.push('decision') };
  const engines = [
    new Idempotency({ hooks: mine, ...otel({ meterProvider: m.meterProvider }) }),
    new Idempotency({ ...otel({ meterProvider: m.meterProvider }), hooks: mine }),
    new Idempotency({ hooks: otelHooks({ meterProvider: m.meterProvider, hooks: mine }) }),
    new Idempotency({ hooks: composeHooks(mine, otelHooks({ meterProvider: m.meterProvider })) }),
  ];
  for (const [i, engine] of engines.entries()) await engine.handle(input(`compose-${i}`));
  expect(seen).toEqual(Array(4).fill(['miss', 'decision']).flat());
  expect(await m.names()).toEqual(
    expect.arrayContaining([
      'oncely.decisions',
      'oncely.store.operation.duration',
      'oncely.executions.active',
    ]),
  );
});

test('a throwing hook stops neither the other hooks nor the request', async () => {
  const m = meter();
  const logged: unknown[] = [];
  const logger = { debug() {}, info() {}, warn() {}, error: (obj: object) => void logged.push(obj) };
  const engine = new Idempotency({
    logger,
    hooks: {
      onDecision() {
        throw new Error('user hook broke');
      },
    },
    ...otel({ meterProvider: m.meterProvider }),
  });
  const decision = await engine.handle(input('throwing'));
  expect(decision.action).toBe('execute');
  expect(await m.names()).toContain('oncely.decisions');
  expect(logged).toHaveLength(1);
});

test('metrics: false records nothing; the hooks object it adds has no timing hook, so the store is not wrapped', async () => {
  const m = meter();
  const store = new MemoryStore();
  const engine = new Idempotency({
    store,
    ...otel({ meterProvider: m.meterProvider, metrics: false, traces: false }),
  });
  expect(engine.observedStore).toBe(store);
  await engine.handle(input('quiet'));
  expect(await m.names()).toEqual([]);
  await store.close();
});

test('idempotent() takes otel() too, as the consumer adapter kind', async () => {
  const m = meter();
  const fn = idempotent(async (id: string) => id.length, {
    key: (id) => id,
    ...otel({ meterProvider: m.meterProvider }),
  });
  await fn('abc');
  await fn('abc');
  expect(await m.names()).toEqual(
    expect.arrayContaining(['oncely.decisions', 'oncely.store.operation.duration']),
  );
});

test('the observers slot is checked', () => {
  expect(() => new Idempotency({ [OBSERVERS]: 'nope' as never })).toThrow(IdempotencyOptionsError);
  expect(() => new Idempotency({ [OBSERVERS]: [{ onHit: 1 as never }] })).toThrow(/observers\[\]\.onHit/);
});

test('several otel() on one meter provider add up (one instrument set per meter)', async () => {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  const a = new Idempotency({ ...otel({ meterProvider }) });
  const b = new Idempotency({ ...otel({ meterProvider }) });
  await a.handle(input('one'));
  await b.handle(input('two'));
  await b.handle(input('three'));
  await reader.forceFlush();
  const decisions = exporter
    .getMetrics()
    .at(-1)
    ?.scopeMetrics.flatMap((s) => s.metrics)
    .find((m) => m.descriptor.name === 'oncely.decisions');
  const executed = decisions?.dataPoints.find((p) => p.attributes['oncely.outcome'] === 'executed');
  expect(executed?.value).toBe(3);
  // Every outcome of a seen adapter kind is reported, zeros included, so rate() and alerts find a series.
  expect(decisions?.dataPoints.find((p) => p.attributes['oncely.outcome'] === 'fenced')?.value).toBe(0);
  expect(decisions?.dataPoints.some((p) => p.attributes['oncely.adapter'] === 'consumer')).toBe(false);
});

test('error.type on the store histogram stays bounded: past 64 distinct classes, the rest are _OTHER', async () => {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  // A store that throws a class of its own on each acquire: 100 class names, as a badly written store could.
  let n = 0;
  class ThrowingStore extends MemoryStore {
    override async acquire(): Promise<never> {
      const name = `Failure${n++}`;
      const Failure = { [name]: class extends Error {} }[name] as new (message: string) => Error;
      throw new Failure('store down');
    }
  }
  const store = new ThrowingStore();
  const quiet = { debug() {}, info() {}, warn() {}, error() {} };
  const engine = new Idempotency({ store, logger: quiet, ...otel({ meterProvider }) });
  for (let i = 0; i < 100; i++) await engine.handle(input(`bounded-${i}`)).catch(() => undefined);
  await reader.forceFlush();
  const points =
    exporter
      .getMetrics()
      .at(-1)
      ?.scopeMetrics.flatMap((s) => s.metrics)
      .find((m) => m.descriptor.name === 'oncely.store.operation.duration')?.dataPoints ?? [];
  const types = points.map((p) => String(p.attributes['error.type']));
  expect(new Set(types).size).toBe(types.length);
  expect(types).toContain('Failure0');
  expect(types).toContain('_OTHER');
  expect(types.length).toBeLessThanOrEqual(65);
  // Every failure is still counted.
  const total = points.reduce((sum, p) => sum + (p.value as { count: number }).count, 0);
  expect(total).toBe(100);
  await store.close();
});
