/**
 * @services rabbitmq redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { delayQueueName } from '@oncely/amqp';
import { type ConsumerProcess, startConsumerProcess, waitUntil } from '@oncely/testing';
import { type ChannelModel, type ConfirmChannel, connect } from 'amqplib';
import Redis from 'ioredis';

// Competing consumers in separate processes, sharing a RedisStore, against the RabbitMQ on this machine. The
// consumers record attempts, side effects and settlements in Redis under a random prefix (deleted in afterAll);
// queues are named oncely-test.<run>.* and deleted in afterAll.
jest.setTimeout(120_000);

const amqpUrl = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomUUID().slice(0, 8);
const script = join(__dirname, 'fixtures', 'consumer.ts');
const IN_PROGRESS_DELAY = 200;

let connection: ChannelModel;
let channel: ConfirmChannel;
let redis: Redis;
const processes: ConsumerProcess[] = [];
const queues = new Set<string>();
const prefixes: string[] = [];

beforeAll(async () => {
  connection = await connect(amqpUrl);
  channel = await connection.createConfirmChannel();
  redis = new Redis(redisUrl);
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  for (const q of queues) await channel.deleteQueue(q);
  await connection.close();
  for (const prefix of prefixes) {
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    if (keys.length > 0) await redis.del(...keys);
  }
  await redis.quit();
});

async function setUp(label: string): Promise<{ queue: string; prefix: string }> {
  const queue = `oncely-test.${run}.${label}`;
  queues.add(queue).add(delayQueueName(queue, IN_PROGRESS_DELAY));
  await channel.assertQueue(queue, { durable: false });
  const prefix = `oncely-amqp-test:${run}:${label}:`;
  prefixes.push(prefix);
  return { queue, prefix };
}

async function spawnConsumer(env: Record<string, string>): Promise<ConsumerProcess> {
  const p = await startConsumerProcess(script, {
    AMQP_URL: amqpUrl,
    REDIS_URL: redisUrl,
    IN_PROGRESS_DELAY: `${IN_PROGRESS_DELAY}ms`,
    ...env,
  });
  processes.push(p);
  return p;
}

function publish(queue: string, key: string, body: string): void {
  // A fresh messageId per publish: duplicates are distinct AMQP messages that share only their key.
  channel.sendToQueue(queue, Buffer.from(body), {
    messageId: randomUUID(),
    headers: { 'idempotency-key': key },
    persistent: true,
  });
}

const sumOf = (hash: Record<string, string>, ...fields: string[]) =>
  fields.reduce((sum, f) => sum + Number(hash[f] ?? 0), 0);

test('1,000 messages, 20% published twice, 3 consumer processes: every side effect happens exactly once', async () => {
  const { queue, prefix } = await setUp('competing');
  const consumers = await Promise.all(
    [1, 2, 3].map(() => spawnConsumer({ QUEUE: queue, PREFIX: prefix, PREFETCH: '10' })),
  );
  const keys = Array.from({ length: 1000 }, (_, i) => `order-${i}`);
  const started = Date.now();
  // 100 duplicates right behind their original (they race it: in-progress path) and 100 at the end (replay path).
  for (let i = 0; i < keys.length; i++) {
    publish(queue, keys[i] as string, `{"order":${i}}`);
    if (i % 10 === 0) publish(queue, keys[i] as string, `{"order":${i}}`);
  }
  for (let i = 5; i < keys.length; i += 10) publish(queue, keys[i] as string, `{"order":${i}}`);
  await channel.waitForConfirms();

  // Every published message ends in exactly one final ack (executed or replayed); delays are intermediate.
  await waitUntil(
    async () => sumOf(await redis.hgetall(`${prefix}settled`), 'ack:executed', 'ack:replayed') >= 1200,
    'all 1,200 messages acked',
    90_000,
  );
  const elapsed = Date.now() - started;
  const effects = await redis.hgetall(`${prefix}effects`);
  expect(Object.keys(effects).sort()).toEqual([...keys].sort());
  expect(Object.entries(effects).filter(([, n]) => n !== '1')).toEqual([]);

  const settled = await redis.hgetall(`${prefix}settled`);
  expect(sumOf(settled, 'ack:executed')).toBe(1000);
  expect(sumOf(settled, 'ack:replayed')).toBe(200);
  expect(Object.keys(settled).filter((k) => k.startsWith('dead-letter') || k.startsWith('retry'))).toEqual(
    [],
  );
  // All three processes did real work.
  const executors = await redis.hgetall(`${prefix}executors`);
  expect(Object.keys(executors).sort()).toEqual(consumers.map((c) => String(c.pid)).sort());
  // Nothing left behind: every message was acked.
  expect((await channel.checkQueue(queue)).messageCount).toBe(0);
  console.log(
    `amqp competing: 1,200 messages in ${elapsed}ms; settled ${JSON.stringify(settled)}; executions per process ${JSON.stringify(executors)}`,
  );
});

test('a consumer SIGKILLed in the middle of a message: redelivered, processed once in the end, nothing lost', async () => {
  const { queue, prefix } = await setUp('sigkill');
  const lockTimeout = 1500;
  const env = {
    QUEUE: queue,
    PREFIX: prefix,
    PREFETCH: '1',
    LOCK_TIMEOUT: `${lockTimeout}ms`,
    WATCH_KEY: 'victim',
  };
  // Process A hangs on `victim` after starting its work and before its side effect (lease live, renewed).
  const a = await spawnConsumer({ ...env, HANG_KEY: 'victim' });
  const keys = Array.from({ length: 20 }, (_, i) => (i === 4 ? 'victim' : `m-${i}`));
  for (const key of keys) publish(queue, key, `{"key":"${key}"}`);
  await channel.waitForConfirms();
  await waitUntil(async () => (await redis.get(`${prefix}hanging`)) === String(a.pid), 'A to hang on victim');
  const b = await spawnConsumer(env);

  const killedAt = Date.now();
  await a.kill(); // no ack, no nack, no release: the broker requeues the delivery, the lease must run out
  await waitUntil(
    async () => sumOf(await redis.hgetall(`${prefix}settled`), 'ack:executed', 'ack:replayed') === 20,
    'all 20 messages acked',
    30_000,
  );
  const recoveredMs = Date.now() - killedAt;

  const effects = await redis.hgetall(`${prefix}effects`);
  expect(Object.keys(effects).sort()).toEqual([...keys].sort()); // nothing lost
  expect(Object.entries(effects).filter(([, n]) => n !== '1')).toEqual([]); // nothing twice
  expect(await redis.hget(`${prefix}attempts`, 'victim')).toBe('2'); // started by A, finished by B
  // B saw the victim while A's lease was still live and held back (delay queue), then ran it.
  const victimEvents = await redis.lrange(`${prefix}watch-events`, 0, -1);
  expect(victimEvents.length).toBeGreaterThanOrEqual(2);
  expect(victimEvents[0]).toBe(`${b.pid} delay:in-progress`);
  expect(victimEvents.at(-1)).toBe(`${b.pid} ack:executed`);
  expect(victimEvents.slice(0, -1).every((e) => e === `${b.pid} delay:in-progress`)).toBe(true);
  // It ran only once A's lease had run out: the lease had about lockTimeout minus one renewal period (1s) left at
  // the kill; the lower bound leaves room for late timers on a loaded machine.
  expect(recoveredMs).toBeGreaterThanOrEqual(lockTimeout / 3);
  expect(recoveredMs).toBeLessThan(lockTimeout + 5000);
  expect((await channel.checkQueue(queue)).messageCount).toBe(0);
  console.log(
    `amqp sigkill: victim processed ${recoveredMs}ms after the kill; victim events ${victimEvents.join(', ')}`,
  );
});
