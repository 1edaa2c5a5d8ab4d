import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { type AcquireOptions, type AcquireResult, MemoryStore, type StoredResponse } from '@oncely/core';
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
    /** `operation:result` → number of recorded durations. */
    async storeOperations(): Promise<Record<string, number>> {
      const out: Record<string, number> = {};
      for (const p of (await metrics()).get('oncely.store.operation.duration') ?? []) {
        const a = p.attributes;
        const id = `${a['oncely.store.operation']}:${a['oncely.store.result']}`;
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

/** A MemoryStore that can be told to fail its acquire or to refuse a completion (as after a lost lease). */
export class FlakyStore extends MemoryStore {
  failAcquire = false;
  fenceComplete = false;
  override async acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    if (this.failAcquire) throw new Error('store unreachable');
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
