/**
 * @services nats
 */
import { randomUUID } from 'node:crypto';
import { AckPolicy, type JsMsg, jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection, nanos } from '@nats-io/transport-node';
import { idempotentConsumer, type NatsSettledEvent } from '@oncely/nats';
import { otel } from '@oncely/opentelemetry';
import { sleep, waitUntil } from '@oncely/testing';
import { context, trace } from '@opentelemetry/api';
import { FlakyStore, telemetry } from './helpers';

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
  // Two copies at once: the second finds the key held (a conflict, nak'd) and is replayed once the first is done.
  await js.publish(subject, 'slow', { msgID: 'SECRET-busy' });
  await sleep(150);
  await js.publish(subject, 'slow', { msgID: 'SECRET-busy' });
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
  expect(published).toBe(7);

  const reasons = events.map((e) => `${e.action}:${e.reason}`);
  const n = (r: string) => reasons.filter((x) => x === r).length;
  const conflicts = n('delay:in-progress');
  expect(conflicts).toBeGreaterThanOrEqual(1);
  // As with AMQP: executed (order-1, flaky twice, busy, down, fence), replayed (order-1, busy), a conflict per nak
  // of busy's copy, mismatch, rejected (no key), store_error, released (the failed attempt), fenced.
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

  const messageSpans = t.spans().filter((s) => s.name === `${subject} process`);
  expect(messageSpans.map((s) => s.attributes['oncely.outcome'])).toEqual(
    expect.arrayContaining(['executed', 'replayed', 'mismatch', 'rejected', 'conflict', 'store_error']),
  );
  const storeSpans = t.spans().filter((s) => s.name.startsWith('oncely.store '));
  const messageIds = new Set(messageSpans.map((s) => s.spanContext().spanId));
  expect(storeSpans.length).toBeGreaterThan(0);
  for (const s of storeSpans) expect(messageIds.has(s.parentSpanContext?.spanId ?? '')).toBe(true);

  const values = await t.everyAttributeValue();
  expect(values.filter((v) => v.includes('SECRET'))).toEqual([]);

  await messages.close();
  await loop;
});
