// A RabbitMQ consumer whose work runs once per message, however often the message is delivered: a producer that
// retries a publish, or the broker redelivering after a consumer crash, makes a duplicate that is acked without
// running the handler. Records live in Redis, so competing consumers share them. Run from the repository root:
//   npm run example:amqp-consumer
import { idempotentConsumer } from '@oncely/amqp';
import { RedisStore } from '@oncely/redis';
import { type ChannelModel, connect } from 'amqplib';
import Redis from 'ioredis';
import { amqpUrl, deadLetterExchange, deadLetterQueue, prefix, queue, redisUrl, unreachable } from './config';

const redis = new Redis(redisUrl, { lazyConnect: true, commandTimeout: 500, maxRetriesPerRequest: 1 });
let redisError: Error | undefined;
redis.on('error', (error) => {
  redisError = error;
  if (redis.status === 'ready' || redis.status === 'reconnecting') console.error(`redis: ${error.message}`);
});
try {
  await redis.connect();
} catch (error) {
  console.error(unreachable('Redis', redisUrl, 'redis', redisError ?? error));
  process.exit(1);
}

let connection: ChannelModel;
try {
  connection = await connect(amqpUrl);
} catch (error) {
  console.error(unreachable('RabbitMQ', amqpUrl.replace(/\/\/[^@]*@/, '//'), 'rabbitmq', error));
  await redis.quit();
  process.exit(1);
}
// The wrapper re-publishes delayed messages on the channel it consumes on, and waits for the broker's confirms.
const channel = await connection.createConfirmChannel();
await channel.assertExchange(deadLetterExchange, 'fanout', { durable: true });
await channel.assertQueue(deadLetterQueue, { durable: true });
await channel.bindQueue(deadLetterQueue, deadLetterExchange, '');
await channel.assertQueue(queue, { durable: true, deadLetterExchange });
await channel.prefetch(10);

let charges = 0;
await channel.consume(
  queue,
  idempotentConsumer(
    async (msg) => {
      const order = JSON.parse(msg.content.toString()) as { amount?: number };
      charges++;
      // The side effect: one line per real execution.
      console.log(
        `order ${msg.properties.messageId}: charged ${order.amount ?? 0} (charge #${charges} in this process)`,
      );
    },
    {
      channel,
      queue,
      store: new RedisStore({ client: redis, prefix }),
      key: 'messageId', // the producer's id for the order: the same for every copy of the message
      onSettled: (event) => {
        if (event.action === 'ack' && event.reason === 'replayed') {
          console.log(`order ${event.key}: duplicate, acked without running the handler`);
        } else if (event.action !== 'ack') {
          console.log(`order ${event.key ?? '(no messageId)'}: ${event.action} (${event.reason})`);
        }
      },
    },
  ),
);

console.log('ready');
console.log(`Consuming ${queue} at ${amqpUrl.replace(/\/\/[^@]*@/, '//')} (records in Redis, prefix ${prefix}). Ctrl+C to stop.
In another terminal, publish the same order twice; this terminal prints one "charged" line and one "duplicate" line:

   npm run example:amqp-publish -- order-1
   npm run example:amqp-publish -- order-1
`);

const stop = async () => {
  await channel.close().catch(() => {});
  await connection.close().catch(() => {});
  await redis.quit().catch(() => {});
  process.exit(0);
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
