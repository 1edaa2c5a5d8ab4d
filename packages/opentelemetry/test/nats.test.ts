/**
 * @services nats
 */
import { randomUUID } from 'node:crypto';
import { AckPolicy, type JsMsg, jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection, nanos } from '@nats-io/transport-node';
import { idempotentConsumer, type NatsSettledEvent } from '@oncely/nats';
import { otel } from '@oncely/opentelemetry';
import { sleep } from '@oncely/testing';
import { context, trace } from '@opentelemetry/api';
import { driveConsumerOutcomes, expectConsumerOutcomes, FlakyStore, telemetry } from './helpers';

// Every consumer outcome produced by real messages through @oncely/nats and the NATS JetStream server on this
// machine, counted by the real OpenTelemetry SDK. One stream of this file's own, ONCELY_OTEL_<run>, deleted (with
// its consumer) in afterAll.
const url = process.env.NATS_URL ?? '127.0.0.1:4222';
const run = randomUUID().slice(0, 8);
const stream = `ONCELY_OTEL_${run}`;
const subject = `oncely-otel.${run}.orders`;
const t = telemetry();
const store = new FlakyStore();
let nc: NatsConnection;

beforeAll(async () => {
  nc = await connect({ servers: url });
  const jsm = await jetstreamManager(nc);
  // A short duplicate window, so that a republished Nats-Msg-Id reaches the consumer (as a redelivery would).
  await jsm.streams.add({ name: stream, subjects: [`oncely-otel.${run}.>`], duplicate_window: nanos(100) });
});
afterAll(async () => {
  const jsm = await jetstreamManager(nc);
  await jsm.streams.delete(stream);
  await nc.close();
  await store.close();
  await t.shutdown();
});

test('every NATS consumer outcome is counted, annotates the message span, and carries no key', async () => {
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  await jsm.consumers.add(stream, {
    durable_name: 'otel',
    ack_policy: AckPolicy.Explicit,
    filter_subject: subject,
    ack_wait: nanos(10_000),
  });
  const messages = await (await js.consumers.get(stream, 'otel')).consume({ max_messages: 10 });

  const events: NatsSettledEvent[] = [];
  let failedOnce = false;
  const handle = idempotentConsumer(
    async (msg: JsMsg) => {
      const body = msg.string();
      if (body === 'slow') await sleep(500);
      if (body === 'fail-once' && !failedOnce) {
        failedOnce = true;
        throw new Error('transient');
      }
    },
    {
      store,
      inProgressDelay: 150,
      retryDelay: 150,
      ...otel({ meterProvider: t.meterProvider }),
      onSettled: (event) => void events.push(event),
    },
  );
  // The message's span, as a NATS instrumentation would make it around the handler.
  const tracer = trace.getTracer('test-nats');
  const loop = (async () => {
    for await (const msg of messages) {
      const span = tracer.startSpan(`${subject} process`);
      void context.with(trace.setSpan(context.active(), span), () => handle(msg)).finally(() => span.end());
    }
  })();

  let published = 0;
  const publish = async (body: string, msgID?: string) => {
    // Past the stream's duplicate window, so the stream keeps every copy, as it does a late retry's.
    await sleep(150);
    published++;
    await js.publish(subject, body, msgID === undefined ? {} : { msgID });
  };
  // Two copies at once: the second finds the key held (a conflict, nak'd) and is replayed once the first is done.
  const publishBusy = async () => {
    await js.publish(subject, 'slow', { msgID: 'SECRET-busy' });
    await sleep(150);
    await js.publish(subject, 'slow', { msgID: 'SECRET-busy' });
  };
  await driveConsumerOutcomes(publish, publishBusy, events, store);
  expect(published).toBe(7);
  await expectConsumerOutcomes(t, events, `${subject} process`);

  await messages.close();
  await loop;
});
