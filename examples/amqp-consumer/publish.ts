// Publishes one order to the example's queue, with the order id as the message's messageId: the key the consumer
// runs each order once by. `npm run example:amqp-publish -- <order-id> [--twice]`; --twice sends two copies
// back to back, like a producer retrying a publish it never saw confirmed.
import { randomUUID } from 'node:crypto';
import { connect } from 'amqplib';
import { amqpUrl, deadLetterExchange, queue, unreachable } from './config';

const args = process.argv.slice(2);
const twice = args.includes('--twice');
const id = args.find((arg) => !arg.startsWith('--')) ?? `order-${randomUUID()}`;

let connection: Awaited<ReturnType<typeof connect>>;
try {
  connection = await connect(amqpUrl);
} catch (error) {
  console.error(unreachable('RabbitMQ', amqpUrl.replace(/\/\/[^@]*@/, '//'), 'rabbitmq', error));
  process.exit(1);
}
const channel = await connection.createConfirmChannel();
// The same declaration as the consumer's, so publishing first works too (the message waits in the queue).
await channel.assertQueue(queue, { durable: true, deadLetterExchange });
const body = Buffer.from(JSON.stringify({ id, amount: 1000 }));
for (let copy = 0; copy < (twice ? 2 : 1); copy++) {
  channel.sendToQueue(queue, body, { messageId: id, persistent: true, contentType: 'application/json' });
}
await channel.waitForConfirms(); // the broker has the message(s) before we say so
console.log(`published ${id}${twice ? ' twice' : ''} to ${queue}`);
await channel.close();
await connection.close();
