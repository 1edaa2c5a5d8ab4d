import { createHash } from 'node:crypto';
import { KafkaJS } from '@confluentinc/kafka-javascript';
import { consumerRuntime } from '@oncely/core/adapter';
import { chargeCard, type Order, store } from './app.js';

const kafka = new KafkaJS.Kafka({ kafkaJS: { clientId: 'charger', brokers: ['localhost:9092'] } });
// librdkafka heartbeats on its own thread; eachMessage must still return within rebalanceTimeout (its max poll
// interval, 5 minutes by default), waits included, or the consumer leaves the group.
const consumer = kafka.consumer({ kafkaJS: { groupId: 'charger', rebalanceTimeout: 300_000 } });
const producer = kafka.producer({ kafkaJS: { idempotent: true } });
await Promise.all([consumer.connect(), producer.connect()]);
await consumer.subscribe({ topics: ['orders'] });

const orderOf = (message: KafkaJS.KafkaMessage) => JSON.parse(String(message.value)) as Order;
const runtime = consumerRuntime<KafkaJS.KafkaMessage>(
  (message) => chargeCard(orderOf(message)),
  // A partition moves between consumers on a rebalance: wait for the old owner rather than delay at once.
  { store, maxAttempts: 5, inProgress: { wait: '30s' } },
  {
    name: 'kafka orders consumer',
    options: [],
    // A business key, not the offset (a redelivery has the same offset, a producer's second send another one).
    keyOf: (message) => `order:${orderOf(message).id}:charge`,
    fingerprint: (message) =>
      createHash('sha256')
        .update(message.value ?? '')
        .digest('base64url'),
  },
);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

await consumer.run({
  eachMessage: async ({ topic, message }) => {
    for (let failures = 0; ; ) {
      const { settlement } = await runtime.decide(message, failures);
      if (settlement.action === 'ack') return; // done (or a duplicate): the offset is committed
      if (settlement.action === 'dead-letter') {
        await producer.send({
          topic: `${topic}.dead`,
          messages: [
            {
              key: message.key,
              value: message.value,
              headers: { ...message.headers, reason: settlement.reason },
            },
          ],
        });
        return;
      }
      if (settlement.action === 'retry') failures = settlement.failures;
      await sleep(settlement.delayMs);
    }
  },
});
