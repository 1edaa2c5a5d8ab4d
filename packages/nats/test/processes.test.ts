/**
 * @services nats redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import {
  AckPolicy,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
} from '@nats-io/jetstream';
import { connect, headers, type NatsConnection, nanos } from '@nats-io/transport-node';
import { type ConsumerProcess, sleep, startConsumerProcess, waitUntil } from '@oncely/testing';
import Redis from 'ioredis';

// Competing consumers in separate processes, sharing a RedisStore, against the NATS server on this machine. The
// consumers record attempts, side effects and settlements in Redis under a random prefix (deleted in afterAll);
// the stream ONCELY_TEST_PROC_<run> (and its consumers) is deleted in afterAll.
jest.setTimeout(120_000);

const natsUrl = process.env.NATS_URL ?? '127.0.0.1:4222';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomUUID().slice(0, 8);
const stream = `ONCELY_TEST_PROC_${run}`;
const script = join(__dirname, 'fixtures', 'consumer.ts');

let nc: NatsConnection;
let jsm: JetStreamManager;
let js: JetStreamClient;
let redis: Redis;
const processes: ConsumerProcess[] = [];
const prefixes: string[] = [];

beforeAll(async () => {
  nc = await connect({ servers: natsUrl });
  jsm = await jetstreamManager(nc);
  js = jetstream(nc);
  await jsm.streams.add({ name: stream, subjects: [`oncely-test-proc.${run}.>`] });
  redis = new Redis(redisUrl);
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  await jsm.streams.delete(stream);
  await nc.close();
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

async function setUp(label: string, ackWaitMs: number): Promise<{ subject: string; prefix: string }> {
  const subject = `oncely-test-proc.${run}.${label}`;
  await jsm.consumers.add(stream, {
    durable_name: label,
    ack_policy: AckPolicy.Explicit,
    filter_subject: subject,
    ack_wait: nanos(ackWaitMs),
  });
  const prefix = `oncely-nats-test:${run}:${label}:`;
  prefixes.push(prefix);
  return { subject, prefix };
}

async function spawnConsumer(env: Record<string, string>): Promise<ConsumerProcess> {
  const p = await startConsumerProcess(script, {
    NATS_URL: natsUrl,
    REDIS_URL: redisUrl,
    STREAM: stream,
    IN_PROGRESS_DELAY: '200ms',
    ...env,
  });
  processes.push(p);
  return p;
}

function publish(subject: string, key: string, body: string) {
  // No Nats-Msg-Id: duplicates reach the stream as distinct messages that share only their key.
  const h = headers();
  h.set('Idempotency-Key', key);
  return js.publish(subject, body, { headers: h });
}

const sumOf = (hash: Record<string, string>, ...fields: string[]) =>
  fields.reduce((sum, f) => sum + Number(hash[f] ?? 0), 0);

test('1,000 messages, 20% published twice, 3 consumer processes: every side effect happens exactly once', async () => {
  const { subject, prefix } = await setUp('competing', 30_000);
  const consumers = await Promise.all(
    [1, 2, 3].map(() => spawnConsumer({ CONSUMER: 'competing', PREFIX: prefix })),
  );
  const keys = Array.from({ length: 1000 }, (_, i) => `order-${i}`);
  const started = Date.now();
  const acks: Promise<unknown>[] = [];
  // 100 duplicates right behind their original (they race it: in-progress path) and 100 at the end (replay path).
  for (let i = 0; i < keys.length; i++) {
    acks.push(publish(subject, keys[i] as string, `{"order":${i}}`));
    if (i % 10 === 0) acks.push(publish(subject, keys[i] as string, `{"order":${i}}`));
  }
  for (let i = 5; i < keys.length; i += 10) acks.push(publish(subject, keys[i] as string, `{"order":${i}}`));
  await Promise.all(acks);
  expect(acks).toHaveLength(1200);

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
  const executors = await redis.hgetall(`${prefix}executors`);
  expect(Object.keys(executors).sort()).toEqual(consumers.map((c) => String(c.pid)).sort());
  await waitUntil(
    async () => (await jsm.consumers.info(stream, 'competing')).num_ack_pending === 0,
    'no ack pending',
  );
  expect((await jsm.consumers.info(stream, 'competing')).num_pending).toBe(0);
  console.log(
    `nats competing: 1,200 messages in ${elapsed}ms; settled ${JSON.stringify(settled)}; executions per process ${JSON.stringify(executors)}`,
  );
});

test('a consumer SIGKILLed in the middle of a message: redelivered, processed once in the end, nothing lost', async () => {
  const ackWaitMs = 2000;
  const { subject, prefix } = await setUp('sigkill', ackWaitMs);
  const env = { CONSUMER: 'sigkill', PREFIX: prefix, LOCK_TIMEOUT: '1500ms', WATCH_KEY: 'victim' };
  // Process A hangs on `victim` after starting its work and before its side effect; its working() heartbeats
  // keep the server from redelivering while it lives.
  const a = await spawnConsumer({ ...env, HANG_KEY: 'victim' });
  const keys = Array.from({ length: 20 }, (_, i) => (i === 4 ? 'victim' : `m-${i}`));
  for (const key of keys) await publish(subject, key, `{"key":"${key}"}`);
  await waitUntil(async () => (await redis.get(`${prefix}hanging`)) === String(a.pid), 'A to hang on victim');
  const hungAt = Date.now();
  const b = await spawnConsumer(env);
  await waitUntil(
    async () => sumOf(await redis.hgetall(`${prefix}settled`), 'ack:executed') === 19,
    'the other 19 messages',
  );
  // A is still alive and has held the victim longer than ack_wait, yet it was not redelivered.
  await sleep(Math.max(0, hungAt + ackWaitMs + 500 - Date.now()));
  expect(await redis.hget(`${prefix}attempts`, 'victim')).toBe('1');

  const killedAt = Date.now();
  await a.kill(); // no ack, no nak, no release: the server redelivers after ack_wait, the lease runs out
  await waitUntil(
    async () => sumOf(await redis.hgetall(`${prefix}settled`), 'ack:executed') === 20,
    'the victim',
    30_000,
  );
  const recoveredMs = Date.now() - killedAt;
  const effects = await redis.hgetall(`${prefix}effects`);
  expect(Object.keys(effects).sort()).toEqual([...keys].sort()); // nothing lost
  expect(Object.entries(effects).filter(([, n]) => n !== '1')).toEqual([]); // nothing twice
  expect(await redis.hget(`${prefix}attempts`, 'victim')).toBe('2'); // started by A, finished by B
  const victimEvents = await redis.lrange(`${prefix}watch-events`, 0, -1);
  expect(victimEvents.at(-1)).toBe(`${b.pid} ack:executed`);
  expect(recoveredMs).toBeLessThan(ackWaitMs + 3000);
  await waitUntil(
    async () => (await jsm.consumers.info(stream, 'sigkill')).num_ack_pending === 0,
    'no ack pending',
  );
  console.log(
    `nats sigkill: victim processed ${recoveredMs}ms after the kill; victim events ${victimEvents.join(', ')}`,
  );
});
