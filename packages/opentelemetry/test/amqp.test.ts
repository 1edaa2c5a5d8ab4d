/**
 * @services rabbitmq
 */
import { randomUUID } from 'node:crypto';
import { type AmqpSettledEvent, delayQueueName, idempotentConsumer } from '@oncely/amqp';
import { otel } from '@oncely/opentelemetry';
import { sleep } from '@oncely/testing';
import { context, trace } from '@opentelemetry/api';
import { type ChannelModel, type ConfirmChannel, type ConsumeMessage, connect } from 'amqplib';
import { driveConsumerOutcomes, expectConsumerOutcomes, FlakyStore, telemetry } from './helpers';

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
    const consume = idempotentConsumer(handler, {
      channel,
      queue,
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
  // Two copies at once: the second finds the key held (a conflict, delayed) and is replayed once the first is done.
  const publishBusy = async () => {
    await publish('slow', 'SECRET-busy');
    await publish('slow', 'SECRET-busy');
  };
  await driveConsumerOutcomes(publish, publishBusy, events, store);
  await expectConsumerOutcomes(t, events, `${queue} process`);
  for (const channel of channels) await channel.close();
});
