// `npm run example:lambda`: invokes the functions of handler.ts in this process with sample events, as Lambda would:
// an HTTP API request sent twice with one Idempotency-Key (one execution, then the replay), and an SQS batch in
// which one order arrives twice and one fails (batchItemFailures).
import { randomUUID } from 'node:crypto';
import { DynamoDBStore } from '@oncely/dynamodb';
import { httpApiRequest, lambdaContext, sqsBatch, sqsRecord } from './events';
import { createCharge, executed, processOrders } from './handler';
import { close, describe, store } from './store';

const run = randomUUID().slice(0, 8);
console.log(`store: ${describe} (ONCELY_STORE=memory|redis|dynamodb)`);
// Local DynamoDB: make the table (declare it with your infrastructure on AWS).
if (store instanceof DynamoDBStore && process.env.DYNAMODB_ENDPOINT !== undefined) await store.createTable();

// 1. HTTP API: the same request twice, as a client retrying after a timeout does.
const key = `charge-${run}`;
console.log(`\nPOST /charges, Idempotency-Key: ${key}`);
for (const attempt of ['first', 'retry']) {
  const result = await createCharge(
    httpApiRequest(key, { amount: 1000 }),
    lambdaContext(`${attempt}-${run}`),
  );
  const answer = typeof result === 'string' ? { statusCode: 200, headers: {}, body: result } : result;
  const headers = Object.fromEntries(
    Object.entries(answer.headers ?? {}).map(([name, value]) => [name.toLowerCase(), String(value)]),
  );
  console.log(
    `${attempt}: ${answer.statusCode} Idempotent-Replayed: ${headers['idempotent-replayed'] ?? '(absent)'} body: ${answer.body}`,
  );
}
console.log(`charges executed: ${executed.charges}`);

// 2. SQS: order A twice (a producer that retried its send), order B, and order C whose work fails.
const [a, b, c] = ['A', 'B', 'C'].map((name) => `order-${name}-${run}`) as [string, string, string];
const event = sqsBatch(
  sqsRecord('m-1', { id: a, amount: 1000 }),
  sqsRecord('m-2', { id: b, amount: 2500 }),
  sqsRecord('m-3', { id: a, amount: 1000 }),
  sqsRecord('m-4', { id: c, amount: 700, declined: true }),
);
console.log(`\nSQS batch: m-1 ${a}, m-2 ${b}, m-3 ${a} (again), m-4 ${c} (its work fails)`);
const response = await processOrders(event, lambdaContext(`batch-${run}`));
console.log(`batch response: ${JSON.stringify(response)}`);
console.log(
  `orders executed: ${[a, b, c].map((id) => `${id.split('-')[1]} ${executed.orders.get(id) ?? 0}`).join(', ')}`,
);

await close();
