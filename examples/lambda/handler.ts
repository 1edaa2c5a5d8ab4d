// The Lambda functions, as you would deploy them: an HTTP API (API Gateway v2) route that creates a charge, and an
// SQS consumer of orders with ReportBatchItemFailures. `invoke.ts` calls them with sample events.
import { idempotentBatch, withIdempotency } from '@oncely/lambda';
import type { APIGatewayProxyEventV2, APIGatewayProxyStructuredResultV2, SQSRecord } from 'aws-lambda';
import { store } from './store';

/** Executions in this process: the replay adds none. */
export const executed = { charges: 0, orders: new Map<string, number>() };

// POST /charges with an Idempotency-Key header: the first request runs, a retry with the same key gets the stored
// response with `Idempotent-Replayed: true`.
export const createCharge = withIdempotency(
  async (event: APIGatewayProxyEventV2): Promise<APIGatewayProxyStructuredResultV2> => {
    const { amount } = JSON.parse(event.body ?? '{}') as { amount?: number };
    executed.charges++;
    const id = `ch_${executed.charges}`;
    console.log(`charge ${id} created (${amount})`);
    return {
      statusCode: 201,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id, amount }),
    };
  },
  { store },
);

// An SQS batch of orders: each order's work runs once per order id (the body's `id`), whichever message carries it.
export const processOrders = idempotentBatch(
  async (record: SQSRecord) => {
    const order = JSON.parse(record.body) as { id: string; amount: number; declined?: boolean };
    if (order.declined) throw new Error(`the payment provider did not answer for ${order.id}`);
    executed.orders.set(order.id, (executed.orders.get(order.id) ?? 0) + 1);
    console.log(`order ${order.id}: charged ${order.amount} (message ${record.messageId})`);
  },
  { store, key: { bodyField: 'id' } },
);
