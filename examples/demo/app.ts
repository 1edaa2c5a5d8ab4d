import { randomUUID } from 'node:crypto';
import { MemoryStore } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { otel } from '@oncely/opentelemetry';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import express, { type Express, type NextFunction, type Request, type Response } from 'express';

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

interface OrderBody extends ChargeBody {
  email?: unknown;
}

/** A charge of the payment provider, and how many requests asked for it under its Idempotency-Key. */
interface ProviderCharge {
  id: string;
  amount: number | null;
  currency: string | null;
  /** Charges made for this key: 1, however many requests carried it. */
  charges: number;
  requests: number;
}

/**
 * Send this header on POST /orders to make the request fail: `after-charge` fails it after the charge step was
 * recorded, before the email; `charge-not-recorded` fails it after the provider charged and before the charge step
 * was recorded, as a crash at that moment would.
 */
export const FAIL_HEADER = 'demo-fail';

/**
 * The demo app: Express 5, `express.json()` then `idempotency()` on every POST/PUT/PATCH, with the default
 * in-memory store. Two routes create "charges":
 * - `POST /charges` answers 201 at once;
 * - `POST /slow-charges` answers 201 after `slowChargeMs`, long enough to send a duplicate while it runs.
 * `POST /orders` runs three steps (docs/steps.md): an order (a local write), a charge through the app's own
 * payment-provider route `POST /provider/charges` (which honours `Idempotency-Key` itself, as a real provider does,
 * and is mounted before oncely so that oncely plays no part in it), and an email queued in an outbox.
 * `GET /metrics` shows the decisions' counters in the Prometheus text format, from @oncely/opentelemetry with the
 * OpenTelemetry SDK's Prometheus exporter (served on this app's port; the exporter starts no server of its own).
 */
export function createApp(options: DemoOptions = {}): Express {
  const slowChargeMs = options.slowChargeMs ?? 5000;
  const log = options.log ?? ((line: string) => console.log(line));
  let charges = 0;
  // The order route's local state, each entry written once per derived key (keyFor), so that a step that ran but
  // was not recorded finds its own entry again.
  const orders = new Map<string, { id: string; amount: number | null }>();
  const outbox = new Map<string, { to: string; orderId: string; chargeId: string }>();
  const providerCharges = new Map<string, ProviderCharge>();

  // OpenTelemetry metrics, read by GET /metrics (docs/observability.md).
  const exporter = new PrometheusExporter({ preventServerStart: true });
  const meterProvider = new MeterProvider({ readers: [exporter] });

  const app = express();
  app.use(express.json());

  // The payment provider: before idempotency(), so oncely never sees these requests. It deduplicates by
  // Idempotency-Key on its own: the first request with a key creates the charge, every later one gets it back.
  app.post('/provider/charges', (req, res) => {
    const key = req.get('idempotency-key');
    if (key === undefined || key === '') {
      res.status(400).json({ error: 'the provider needs an Idempotency-Key header' });
      return;
    }
    const body = req.body as ChargeBody | undefined;
    let charge = providerCharges.get(key);
    if (charge === undefined) {
      charge = {
        id: `pch_${providerCharges.size + 1}_${randomUUID().slice(0, 8)}`,
        amount: typeof body?.amount === 'number' ? body.amount : null,
        currency: typeof body?.currency === 'string' ? body.currency : null,
        charges: 1,
        requests: 0,
      };
      providerCharges.set(key, charge);
      log(`provider: charge ${charge.id} made for Idempotency-Key ${key}`);
    } else {
      log(
        `provider: Idempotency-Key ${key} seen before, answering charge ${charge.id} again (no new charge)`,
      );
    }
    charge.requests++;
    res.status(201).json({ id: charge.id, amount: charge.amount, currency: charge.currency });
  });

  // What the provider did, by Idempotency-Key: one charge per key, however many requests carried it.
  app.get('/provider/charges', (_req, res) => {
    res.json(Object.fromEntries(providerCharges));
  });

  app.use(
    idempotency({
      ...otel({ meterProvider }),
      store: new MemoryStore(),
      hooks: {
        onMiss: ({ key }) => log(`key ${key}: no stored response, running the handler`),
        onHit: ({ key }) => log(`key ${key}: completed before, replaying the stored response`),
        onConflict: ({ key }) => log(`key ${key}: still running, answering 409`),
        onMismatch: ({ key }) => log(`key ${key}: reused with a different request, answering 422`),
        onRelease: ({ key, reason, status }) =>
          log(
            `key ${key}: released (${status ?? reason}); a retry runs the handler again, resuming its steps`,
          ),
        onStep: ({ key, name, outcome }) =>
          log(
            outcome === 'run'
              ? `key ${key}: step ${name} ran and was recorded`
              : `key ${key}: step ${name} recorded by an earlier attempt, not run again`,
          ),
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

  // Three steps under the request's key. A retry of a key whose attempt failed half-way resumes after the steps it
  // recorded: the charge is not made again, and the answer carries the first charge's id.
  app.post('/orders', async (req, res) => {
    const ctx = req.idempotency;
    if (ctx === undefined) {
      res.status(400).json({ error: 'POST /orders needs an Idempotency-Key header' });
      return;
    }
    const body = req.body as OrderBody | undefined;
    const amount = typeof body?.amount === 'number' ? body.amount : null;
    const currency = typeof body?.currency === 'string' ? body.currency : null;

    // A local write, once per key.
    const order = await ctx.step('order', () => {
      const opKey = ctx.keyFor('order');
      let entry = orders.get(opKey);
      if (entry === undefined) {
        entry = { id: `ord_${orders.size + 1}`, amount };
        orders.set(opKey, entry);
        log(`order ${entry.id} written`);
      }
      return entry;
    });

    // The foreign effect, with the step's own key as the provider's Idempotency-Key: had this process died after
    // the provider charged and before the step was recorded, the retry's call would get the same charge back.
    const charge = await ctx.step('charge', async () => {
      const response = await fetch(`http://127.0.0.1:${req.socket.localPort}/provider/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': ctx.keyFor('charge') },
        body: JSON.stringify({ amount, currency }),
      });
      if (!response.ok) throw new Error(`the provider answered ${response.status}`);
      const charged = (await response.json()) as { id: string };
      if (req.get(FAIL_HEADER) === 'charge-not-recorded') {
        throw new Error(
          `simulated failure after the provider made charge ${charged.id}, before the step's record`,
        );
      }
      return charged;
    });

    if (req.get(FAIL_HEADER) === 'after-charge') {
      throw new Error(`simulated failure after charge ${charge.id}, before the email`);
    }

    // The email, queued in an outbox (a relay would send it), once per key.
    await ctx.step('email', () => {
      const opKey = ctx.keyFor('email');
      if (!outbox.has(opKey)) {
        outbox.set(opKey, {
          to: typeof body?.email === 'string' ? body.email : 'customer@example.com',
          orderId: order.id,
          chargeId: charge.id,
        });
        log(`email for order ${order.id} queued in the outbox`);
      }
    });

    res.status(201).json({ orderId: order.id, chargeId: charge.id, amount, currency, emailQueued: true });
  });

  app.get('/metrics', (req, res) => {
    exporter.getMetricsRequestHandler(req, res);
  });

  app.get('/', (_req, res) => {
    res
      .type('text/plain')
      .send(
        'oncely demo: POST /charges, /slow-charges or /orders with an Idempotency-Key header; GET /provider/charges for the provider; GET /metrics for the counters.\n',
      );
  });

  // A failed request (the simulated failure) answers 500 as JSON; oncely has released its key by then.
  app.use((error: unknown, _req: Request, res: Response, _next: NextFunction) => {
    log(`request failed: ${error instanceof Error ? error.message : String(error)}`);
    res.status(500).json({ error: error instanceof Error ? error.message : 'internal error' });
  });

  return app;
}
