/**
 * @services rabbitmq
 */
import { randomUUID } from 'node:crypto';
import { type AmqpSettledEvent, delayQueueName, idempotentConsumer } from '@oncely/amqp';
import { otel } from '@oncely/opentelemetry';
import { sleep, waitUntil } from '@oncely/testing';
import { context, trace } from '@opentelemetry/api';
import { type ChannelModel, type ConfirmChannel, type ConsumeMessage, connect } from 'amqplib';
import { FlakyStore, telemetry } from './helpers';

// Every consumer outcome produced by real messages through @oncely/amqp and the RabbitMQ on this machine, counted
// by the real OpenTelemetry SDK. Queues are named oncely-test.<run>.otel.* and deleted in afterAll.
const url = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const run = randomUUID().slice(0, 8);
const t = telemetry();

let connection: ChannelModel;
let admin: ConfirmChannel;
const queues = new Set<string>();
const exchanges = new Set<string>();
const store = new FlakyStore();

beforeAll(async () => {
  connection = await connect(url);
  admin = await connection.createConfirmChannel();
});
afterAll(async () => {
  for (const q of queues) await admin.deleteQueue(q);
  for (const e of exchanges) await admin.deleteExchange(e);
  await connection.close();
  await store.close();
  await t.shutdown();
});

test('every consumer outcome is counted, annotates the message span, and carries no key', async () => {
  const queue = `oncely-test.${run}.otel`;
  const dlx = `${queue}.dlx`;
  const dead = `${queue}.dead`;
  exchanges.add(dlx);
  queues.add(queue).add(dead);
  await admin.assertExchange(dlx, 'fanout', { durable: false });
  await admin.assertQueue(dead, { durable: false });
  await admin.bindQueue(dead, dlx, '');
  await admin.assertQueue(queue, { durable: false, deadLetterExchange: dlx });

  const events: AmqpSettledEvent[] = [];
  let failedOnce = false;
  const handler = async (msg: ConsumeMessage) => {
    const body = msg.content.toString();
    if (body === 'slow') await sleep(500);
    if (body === 'fail-once' && !failedOnce) {
      failedOnce = true;
      throw new Error('transient');
    }
  };
  const tracer = trace.getTracer('test-amqp');
  const channels: ConfirmChannel[] = [];
  for (let i = 0; i < 2; i++) {
    const channel = await connection.createConfirmChannel();
    await channel.prefetch(1);
    channels.push(channel);
    const consume = idempotentConsumer(channel, queue, handler, {
      store,
      inProgressDelay: 150,
      retryDelay: 150,
      ...otel({ meterProvider: t.meterProvider }),
      onSettled: (event) => {
        events.push(event);
        if (event.delayMs !== undefined) queues.add(delayQueueName(queue, event.delayMs));
      },
    });
    // The message's span, as an amqplib instrumentation would make it around the consume callback.
    await channel.consume(queue, (msg) => {
      const span = tracer.startSpan(`${queue} process`);
      void context.with(trace.setSpan(context.active(), span), () => consume(msg)).finally(() => span.end());
    });
  }
  const publish = async (body: string, messageId?: string) => {
    admin.sendToQueue(queue, Buffer.from(body), messageId === undefined ? {} : { messageId });
    await admin.waitForConfirms();
  };
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
  await publish('slow', 'SECRET-busy');
  await publish('slow', 'SECRET-busy');
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

  const reasons = events.map((e) => `${e.action}:${e.reason}`);
  const n = (r: string) => reasons.filter((x) => x === r).length;
  const conflicts = n('delay:in-progress');
  expect(conflicts).toBeGreaterThanOrEqual(1);
  // Each settlement matches one decision: executed (order-1, flaky twice, busy, down, fence), replayed (order-1,
  // busy), conflict (each delay of busy's duplicate), mismatch, rejected (no key), store_error, released (the
  // failed attempt), fenced.
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

  const messageSpans = t.spans().filter((s) => s.name === `${queue} process`);
  const outcomes = messageSpans.map((s) => s.attributes['oncely.outcome']);
  expect(outcomes).toEqual(
    expect.arrayContaining(['executed', 'replayed', 'mismatch', 'rejected', 'conflict', 'store_error']),
  );
  const storeSpans = t.spans().filter((s) => s.name.startsWith('oncely.store '));
  const messageIds = new Set(messageSpans.map((s) => s.spanContext().spanId));
  expect(storeSpans.length).toBeGreaterThan(0);
  for (const s of storeSpans) expect(messageIds.has(s.parentSpanContext?.spanId ?? '')).toBe(true);

  const values = await t.everyAttributeValue();
  expect(values.filter((v) => v.includes('SECRET'))).toEqual([]);
  for (const channel of channels) await channel.close();
});
