/**
 * @services rabbitmq redis
 */
import { randomUUID } from 'node:crypto';
import { delayQueueName } from '@oncely/amqp';
import { type CommandProcess, runRootScript, runRootScriptToEnd, waitUntil } from '@oncely/testing';
import { connect } from 'amqplib';
import Redis from 'ioredis';

// The example as a user runs it: `npm run example:amqp-consumer` in one terminal, `npm run example:amqp-publish --
// <id>` in another, on a queue and a Redis key prefix of this file's own.
const amqpUrl = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomUUID().slice(0, 8);
const env = {
  QUEUE: `oncely-test-example-${run}`,
  ONCELY_PREFIX: `oncely-test-example-${run}:`,
  AMQP_URL: amqpUrl,
};
let consumer: CommandProcess;

const charged = (id: string) =>
  consumer.output.filter((line) => line.startsWith(`order ${id}: charged`)).length;
const duplicates = (id: string) =>
  consumer.output.filter((line) => line.startsWith(`order ${id}: duplicate`)).length;

async function publish(id: string, ...flags: string[]) {
  const { code, output } = await runRootScriptToEnd('example:amqp-publish', [id, ...flags], env);
  expect({ code, published: output.some((line) => line.startsWith(`published ${id}`)) }).toEqual({
    code: 0,
    published: true,
  });
}

beforeAll(async () => {
  consumer = runRootScript('example:amqp-consumer', [], env);
  await consumer.waitForLine(/^ready$/, 60_000);
}, 70_000);

afterAll(async () => {
  await consumer?.kill();
  // Only what this file made: its queues and exchange, its Redis keys.
  const connection = await connect(amqpUrl);
  const channel = await connection.createChannel();
  for (const name of [env.QUEUE, `${env.QUEUE}.dead-letter`, delayQueueName(env.QUEUE, 1000)]) {
    await channel.deleteQueue(name);
  }
  await channel.deleteExchange(`${env.QUEUE}.dead-letter`);
  await connection.close();
  const redis = new Redis(redisUrl);
  const keys: string[] = [];
  for await (const batch of redis.scanStream({ match: `${env.ONCELY_PREFIX}*`, count: 1000 })) {
    keys.push(...(batch as string[]));
  }
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
});

test('an order published twice is charged once; the second delivery is acked as a duplicate', async () => {
  const id = `order-${randomUUID()}`;
  await publish(id);
  await waitUntil(() => charged(id) === 1, `the charge of ${id}`);
  await publish(id);
  await waitUntil(() => duplicates(id) === 1, `the duplicate of ${id}`);
  await new Promise((resolve) => setTimeout(resolve, 500)); // a second charge, if any, has printed by now
  expect(charged(id)).toBe(1);
}, 60_000);

test('ten orders, each published twice back to back: ten charges, ten duplicates', async () => {
  const ids = Array.from({ length: 10 }, () => `order-${randomUUID()}`);
  await Promise.all(ids.map((id) => publish(id, '--twice')));
  // A copy that arrives while the first still runs is delayed (1 s) and then acked as a duplicate.
  await waitUntil(() => ids.every((id) => charged(id) + duplicates(id) === 2), 'every copy settled', 30_000);
  await new Promise((resolve) => setTimeout(resolve, 500));
  expect(ids.map((id) => [charged(id), duplicates(id)])).toEqual(ids.map(() => [1, 1]));
}, 60_000);
