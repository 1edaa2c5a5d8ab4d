/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import { freePort, runRootScriptToEnd } from '@oncely/testing';
import Redis from 'ioredis';
import { expectReplayAndBatch } from './checks';

// dynalite 4 ships no types: the one call used here.
const dynalite = require('dynalite') as (options: Record<string, number>) => Server;

// The example on a shared store, chosen by ONCELY_STORE, under a key prefix of this file's own.
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `oncely-test-example-lambda-${randomUUID().slice(0, 8)}:`;

afterAll(async () => {
  const redis = new Redis(redisUrl);
  const keys: string[] = [];
  for await (const batch of redis.scanStream({ match: `${prefix}*`, count: 1000 }))
    keys.push(...(batch as string[]));
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
});

test('on Redis', async () => {
  const { code, output } = await runRootScriptToEnd('example:lambda', [], {
    ONCELY_STORE: 'redis',
    ONCELY_PREFIX: prefix,
    REDIS_URL: redisUrl,
  });
  expect(code).toBe(0);
  expect(output[0]).toMatch(/^store: RedisStore/);
  expectReplayAndBatch(output);
}, 60_000);

test('on DynamoDB (dynalite)', async () => {
  const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  const port = await freePort();
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', () => resolve()));
  try {
    const { code, output } = await runRootScriptToEnd('example:lambda', [], {
      ONCELY_STORE: 'dynamodb',
      DYNAMODB_ENDPOINT: `http://127.0.0.1:${port}`,
      DYNAMODB_TABLE: 'oncely-example-lambda',
      AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    });
    expect(code).toBe(0);
    expect(output[0]).toMatch(/^store: DynamoDBStore/);
    expectReplayAndBatch(output);
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
}, 90_000);
