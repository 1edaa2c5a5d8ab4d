import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { type AcquireResult, MemoryStore, type StoredResponse } from '@oncely/core';
import type { AcquireOptions } from '@oncely/core/adapter';
import { waitUntil } from '@oncely/testing';
import { type Attributes, context, SpanKind, trace } from '@opentelemetry/api';
import {
  AggregationTemporality,
  type DataPoint,
  type Histogram,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

/** The real SDK with in-memory exporters: metrics read on demand, spans kept as they end. */
export function telemetry() {
  const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({
    exporter: metricExporter,
    exportIntervalMillis: 3_600_000,
  });
  const meterProvider = new MeterProvider({ readers: [reader] });
  const spanExporter = new InMemorySpanExporter();
  const tracerProvider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spanExporter)] });
  // Registers the AsyncLocalStorage context manager too, as the Node SDK does.
  tracerProvider.register();

  async function metrics() {
    await reader.forceFlush();
    const last = metricExporter.getMetrics().at(-1);
    const byName = new Map<string, DataPoint<unknown>[]>();
    for (const scope of last?.scopeMetrics ?? []) {
      for (const metric of scope.metrics) {
        byName.set(metric.descriptor.name, metric.dataPoints as DataPoint<unknown>[]);
      }
    }
    return byName;
  }

  return {
    meterProvider,
    tracerProvider,
    spans: (): ReadableSpan[] => spanExporter.getFinishedSpans(),
    metrics,
    /** `adapter:outcome` → count, from the decisions counter. */
    async decisions(): Promise<Record<string, number>> {
      const out: Record<string, number> = {};
      for (const p of (await metrics()).get('oncely.decisions') ?? []) {
        out[`${p.attributes['oncely.adapter']}:${p.attributes['oncely.outcome']}`] = p.value as number;
      }
      return out;
    },
    /** `operation:ok` or `operation:error` (a failure carries `error.type`) → number of recorded durations. */
    async storeOperations(): Promise<Record<string, number>> {
      const out: Record<string, number> = {};
      for (const p of (await metrics()).get('oncely.store.operation.duration') ?? []) {
        const a = p.attributes;
        const id = `${a['oncely.store.operation']}:${a['error.type'] === undefined ? 'ok' : 'error'}`;
        out[id] = (out[id] ?? 0) + (p.value as Histogram).count;
      }
      return out;
    },
    async active(adapter: string): Promise<number | undefined> {
      const points = (await metrics()).get('oncely.executions.active') ?? [];
      return points.find((p) => p.attributes['oncely.adapter'] === adapter)?.value as number | undefined;
    },
    /** Every attribute value on every metric point and span (and span event). */
    async everyAttributeValue(): Promise<string[]> {
      const values: string[] = [];
      const add = (attributes: Attributes | undefined) => {
        for (const [name, value] of Object.entries(attributes ?? {})) values.push(`${name}=${String(value)}`);
      };
      for (const points of (await metrics()).values()) for (const p of points) add(p.attributes);
      for (const span of spanExporter.getFinishedSpans()) {
        add(span.attributes);
        for (const event of span.events) add(event.attributes);
      }
      return values;
    },
    async shutdown() {
      await meterProvider.shutdown();
      await tracerProvider.shutdown();
      trace.disable();
      context.disable();
    },
  };
}

/**
 * An HTTP server whose every request runs in a SERVER span, as @opentelemetry/instrumentation-http makes one
 * (request and response emitters bound to its context, so body parsing keeps it).
 */
export function tracedServer(handler: (req: IncomingMessage, res: ServerResponse) => void): Server {
  return createServer((req, res) => tracedRequest(req, res, handler));
}

export function tracedRequest(
  req: IncomingMessage,
  res: ServerResponse,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
): void {
  const tracer = trace.getTracer('test-http-server');
  const span = tracer.startSpan(`${req.method}`, { kind: SpanKind.SERVER });
  const ctx = trace.setSpan(context.active(), span);
  context.bind(ctx, req);
  context.bind(ctx, res);
  res.on('finish', () => span.end());
  context.with(ctx, () => handler(req, res));
}

/** What FlakyStore throws: a class of its own, to find as the failed operation's `error.type`. */
export class StoreDownError extends Error {}

/** A MemoryStore that can be told to fail its acquire or to refuse a completion (as after a lost lease). */
export class FlakyStore extends MemoryStore {
  failAcquire = false;
  fenceComplete = false;
  override async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    if (this.failAcquire) throw new StoreDownError('store unreachable');
    return super.acquire(key, options);
  }
  override async complete(
    key: string,
    token: string,
    response: StoredResponse,
    ttlMs: number,
  ): Promise<boolean> {
    if (this.fenceComplete) return false;
    return super.complete(key, token, response, ttlMs);
  }
}

/** A promise and its resolve function. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open = () => {};
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** What the consumer scenario reads of each settlement (a broker wrapper's `onSettled` event). */
export interface SettledEvent {
  readonly action: string;
  readonly reason: string;
  readonly key?: string | undefined;
}

/**
 * Drives every consumer outcome through one broker wrapper: executed, replayed, mismatch, rejected (no key), a failed
 * attempt released and retried, a conflict (two copies of a slow message at once, sent by `publishBusy`), a store
 * error and a fenced completion. The handler is expected to sleep 500 ms on the body 'slow' and to throw once on
 * 'fail-once'. Keys start with SECRET, so `expectConsumerOutcomes` can check that none reaches an attribute.
 */
export async function driveConsumerOutcomes(
  publish: (body: string, key?: string) => Promise<void>,
  publishBusy: () => Promise<void>,
  events: readonly SettledEvent[],
  store: FlakyStore,
): Promise<void> {
  const settled = (n: number, what: string) => waitUntil(() => events.length >= n, what);
  await publish('a', 'SECRET-order-1');
  await settled(1, 'executed');
  await publish('a', 'SECRET-order-1');
  await settled(2, 'replayed');
  await publish('b', 'SECRET-order-1');
  await settled(3, 'mismatch');
  await publish('no key');
  await settled(4, 'rejected');
  await publish('fail-once', 'SECRET-flaky');
  await waitUntil(() => events.some((e) => e.reason === 'executed' && e.key === 'SECRET-flaky'), 'retried');
  await publishBusy();
  await waitUntil(
    () => events.filter((e) => e.key === 'SECRET-busy' && e.action === 'ack').length === 2,
    'busy',
  );
  store.failAcquire = true;
  await publish('down', 'SECRET-down');
  await waitUntil(() => events.some((e) => e.reason === 'store-error'), 'store error');
  store.failAcquire = false;
  await waitUntil(() => events.some((e) => e.reason === 'executed' && e.key === 'SECRET-down'), 'store back');
  store.fenceComplete = true;
  await publish('fence', 'SECRET-fence');
  await waitUntil(() => events.some((e) => e.key === 'SECRET-fence'), 'fenced');
  store.fenceComplete = false;
}

/**
 * What `driveConsumerOutcomes` must have produced: each settlement matches one decision (executed: order-1, flaky
 * twice, busy, down, fence; replayed: order-1, busy; a conflict per delay of busy's second copy; mismatch; rejected;
 * store_error; released: the failed attempt; fenced), the store operations timed, nothing left in flight, the
 * outcome on each message's span (named `spanName`) with the store spans under it, and no key in any attribute.
 */
export async function expectConsumerOutcomes(
  t: ReturnType<typeof telemetry>,
  events: readonly SettledEvent[],
  spanName: string,
): Promise<void> {
  const reasons = events.map((e) => `${e.action}:${e.reason}`);
  const n = (r: string) => reasons.filter((x) => x === r).length;
  const conflicts = n('delay:in-progress');
  expect(conflicts).toBeGreaterThanOrEqual(1);
  expect(await t.decisions()).toEqual({
    'consumer:executed': 6,
    'consumer:replayed': 2,
    'consumer:conflict': conflicts,
    'consumer:mismatch': 1,
    'consumer:rejected': 1,
    'consumer:store_error': 1,
    'consumer:released': 1,
    'consumer:fenced': 1,
  });
  expect(n('ack:executed') + n('retry:failed')).toBe(6);

  const ops = await t.storeOperations();
  expect(ops['acquire:error']).toBe(1);
  expect(ops['complete:ok']).toBe(5);
  expect(ops['release:ok']).toBe(1);
  expect(await t.active('consumer')).toBe(0);

  const messageSpans = t.spans().filter((s) => s.name === spanName);
  expect(messageSpans.map((s) => s.attributes['oncely.outcome'])).toEqual(
    expect.arrayContaining(['executed', 'replayed', 'mismatch', 'rejected', 'conflict', 'store_error']),
  );
  const storeSpans = t.spans().filter((s) => s.name.startsWith('oncely.store '));
  const messageIds = new Set(messageSpans.map((s) => s.spanContext().spanId));
  expect(storeSpans.length).toBeGreaterThan(0);
  for (const s of storeSpans) expect(messageIds.has(s.parentSpanContext?.spanId ?? '')).toBe(true);

  const values = await t.everyAttributeValue();
  expect(values.filter((v) => v.includes('SECRET'))).toEqual([]);
}
