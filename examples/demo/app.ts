import { randomUUID } from 'node:crypto';
import { MemoryStore } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { otel } from '@oncely/opentelemetry';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import express, { type Express } from 'express';

export interface DemoOptions {
  /** How long POST /slow-charges takes, in ms. Default: 5000. */
  slowChargeMs?: number;
  /** Where the demo writes one line per event. Default: console.log. */
  log?: (line: string) => void;
}

interface ChargeBody {
  amount?: unknown;
  currency?: unknown;
}

/**
 * The demo app: Express 5, `express.json()` then `idempotency()` on every POST/PUT/PATCH, with the default
 * in-memory store. Two routes create "charges":
 * - `POST /charges` answers 201 at once;
 * - `POST /slow-charges` answers 201 after `slowChargeMs`, long enough to send a duplicate while it runs.
 * `GET /metrics` shows the decisions' counters in the Prometheus text format, from @oncely/opentelemetry with the
 * OpenTelemetry SDK's Prometheus exporter (served on this app's port; the exporter starts no server of its own).
 */
export function createApp(options: DemoOptions = {}): Express {
  const slowChargeMs = options.slowChargeMs ?? 5000;
  const log = options.log ?? ((line: string) => console.log(line));
  let charges = 0;

  // OpenTelemetry metrics, read by GET /metrics (docs/observability.md).
  const exporter = new PrometheusExporter({ preventServerStart: true });
  const meterProvider = new MeterProvider({ readers: [exporter] });

  const app = express();
  app.use(express.json());
  app.use(
    idempotency({
      ...otel({ meterProvider }),
      store: new MemoryStore(),
      hooks: {
        onMiss: ({ key }) => log(`key ${key}: new, running the handler`),
        onHit: ({ key }) => log(`key ${key}: completed before, replaying the stored response`),
        onConflict: ({ key }) => log(`key ${key}: still running, answering 409`),
        onMismatch: ({ key }) => log(`key ${key}: reused with a different request, answering 422`),
      },
    }),
  );

  const createCharge = (body: ChargeBody | undefined) => {
    const id = `ch_${++charges}_${randomUUID().slice(0, 8)}`;
    log(`charge ${id} created`);
    return {
      id,
      amount: typeof body?.amount === 'number' ? body.amount : null,
      currency: typeof body?.currency === 'string' ? body.currency : null,
      created: new Date().toISOString(),
    };
  };

  app.post('/charges', (req, res) => {
    res.status(201).json(createCharge(req.body as ChargeBody | undefined));
  });

  app.post('/slow-charges', async (req, res) => {
    await new Promise((resolve) => setTimeout(resolve, slowChargeMs));
    res.status(201).json(createCharge(req.body as ChargeBody | undefined));
  });

  app.get('/metrics', (req, res) => {
    exporter.getMetricsRequestHandler(req, res);
  });

  app.get('/', (_req, res) => {
    res
      .type('text/plain')
      .send(
        'oncely demo: POST /charges or /slow-charges with an Idempotency-Key header; GET /metrics for the counters.\n',
      );
  });

  return app;
}
