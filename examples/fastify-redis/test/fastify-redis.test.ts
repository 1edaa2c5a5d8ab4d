/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { type CommandProcess, runRootScript } from '@oncely/testing';
import Redis from 'ioredis';

// The example as a user runs it: `npm run example:fastify-redis` at the root, twice (two instances, one Redis).
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test-example-${randomUUID()}:`;
const started: CommandProcess[] = [];

async function start(): Promise<{ app: CommandProcess; url: string }> {
  const app = runRootScript('example:fastify-redis', [], {
    PORT: '0',
    ONCELY_PREFIX: prefix,
    REDIS_URL: redisUrl,
  });
  started.push(app);
  const [, url] = await app.waitForLine(/listening on (http:\/\/\S+)/);
  return { app, url: url as string };
}

const pay = (url: string, key: string, amount = 1000) =>
  fetch(`${url}/payments`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: JSON.stringify({ amount }),
  });

const created = (app: CommandProcess, key: string) =>
  app.output.filter((line) => line.startsWith('payment ') && line.includes(`(key ${key},`)).length;

let first: { app: CommandProcess; url: string };

beforeAll(async () => {
  first = await start();
}, 60_000);

afterAll(async () => {
  await Promise.all(started.map((app) => app.kill()));
  // Only this file's keys: the Redis is shared.
  const redis = new Redis(redisUrl);
  const keys: string[] = [];
  for await (const batch of redis.scanStream({ match: `${prefix}*`, count: 1000 }))
    keys.push(...(batch as string[]));
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
});

test('the same payment twice: 201, then the stored 201 replayed; the handler ran once', async () => {
  const key = `pay-${randomUUID()}`;
  const one = await pay(first.url, key);
  const oneBody = await one.text();
  expect(one.status).toBe(201);
  expect(one.headers.get('idempotent-replayed')).toBeNull();

  const two = await pay(first.url, key);
  expect(two.status).toBe(201);
  expect(two.headers.get('idempotent-replayed')).toBe('true');
  expect(await two.text()).toBe(oneBody);
  expect(created(first.app, key)).toBe(1);
});

test('20 simultaneous requests with one key: one execution, the rest replays or 409', async () => {
  const key = `pay-${randomUUID()}`;
  const answers = await Promise.all(Array.from({ length: 20 }, () => pay(first.url, key)));
  const statuses = answers.map((answer) => answer.status);
  expect(statuses.every((status) => status === 201 || status === 409)).toBe(true);
  const fresh = answers.filter(
    (answer) => answer.status === 201 && answer.headers.get('idempotent-replayed') === null,
  );
  expect(fresh).toHaveLength(1);
  await new Promise((resolve) => setTimeout(resolve, 200)); // a second execution, if any, has printed by now
  expect(created(first.app, key)).toBe(1);
});

test('the same key with another body: 422 problem+json, and the stored payment stays', async () => {
  const key = `pay-${randomUUID()}`;
  const stored = await (await pay(first.url, key, 1000)).text();
  const other = await pay(first.url, key, 9999);
  expect(other.status).toBe(422);
  expect(other.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  expect(await pay(first.url, key, 1000).then((answer) => answer.text())).toBe(stored);
  expect(created(first.app, key)).toBe(1);
});

test('a payment made on one instance is replayed by a second instance on the same Redis', async () => {
  const second = await start();
  const key = `pay-${randomUUID()}`;
  const stored = await (await pay(first.url, key)).text();
  const there = await pay(second.url, key);
  expect(there.headers.get('idempotent-replayed')).toBe('true');
  expect(await there.text()).toBe(stored);
  expect(created(first.app, key) + created(second.app, key)).toBe(1);
}, 60_000);
