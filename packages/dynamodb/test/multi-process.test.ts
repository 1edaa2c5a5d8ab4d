import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { BatchGetItemCommand } from '@aws-sdk/client-dynamodb';
import { type AppProcess, fireAtOnce, startAppProcess } from '@oncely/testing';
import { DynamoDBStore } from '../src';
import { type LocalDynamoDB, randomTableName, startDynalite } from './helpers';

// 4 app processes (2 Express, 2 Fastify) on one local DynamoDB, started here and served from this process on
// 127.0.0.1 until afterAll; 2,000 requests over 200 keys, all fired at once. About 30 s alone; 60 to 120 s and more on
// a loaded machine, since the local DynamoDB shares this process with the 2,000 requests.
jest.setTimeout(240_000);

const tableName = randomTableName();
const prefix = `oncely-mp:${randomUUID()}:`;
let local: LocalDynamoDB;
let apps: AppProcess[] = [];

beforeAll(async () => {
  local = await startDynalite({ returnOldItem: true });
  await new DynamoDBStore({ client: local.client(), tableName }).createTable();
  const script = join(__dirname, 'fixtures', 'app.ts');
  apps = await Promise.all(
    ['express', 'fastify', 'express', 'fastify'].map((framework) =>
      startAppProcess(script, {
        FRAMEWORK: framework,
        DYNAMODB_ENDPOINT: local.endpoint,
        TABLE: tableName,
        PREFIX: prefix,
      }),
    ),
  );
});
afterAll(async () => {
  await Promise.all(apps.map((app) => app.kill()));
  await local?.stop();
});

async function executionCounts(keys: string[]): Promise<Map<string, number>> {
  const client = local.client();
  const counts = new Map<string, number>();
  for (let i = 0; i < keys.length; i += 100) {
    let pending = keys.slice(i, i + 100).map((key) => ({ pk: { S: `${prefix}exec:${key}` } }));
    while (pending.length > 0) {
      const { Responses, UnprocessedKeys } = await client.send(
        new BatchGetItemCommand({ RequestItems: { [tableName]: { Keys: pending, ConsistentRead: true } } }),
      );
      for (const item of Responses?.[tableName] ?? []) {
        counts.set(item.pk?.S?.slice(`${prefix}exec:`.length) ?? '', Number(item.executions?.N));
      }
      pending = (UnprocessedKeys?.[tableName]?.Keys ?? []) as typeof pending;
    }
  }
  return counts;
}

test('exactly one execution per key; every other answer is a replay or a 409', async () => {
  const keys = Array.from({ length: 200 }, (_, i) => `mp-${i}-${randomUUID()}`);
  const results = await fireAtOnce({ urls: apps.map((a) => a.url), path: '/charges', keys, total: 2000 });

  const executions = await executionCounts(keys);
  expect(executions.size).toBe(200);
  expect([...executions].filter(([, n]) => n !== 1)).toEqual([]);

  const originals = results.filter((r) => r.status === 201 && !r.replayed);
  const replays = results.filter((r) => r.status === 201 && r.replayed);
  const conflicts = results.filter((r) => r.status === 409);
  expect(originals).toHaveLength(200);
  expect(new Set(originals.map((r) => r.key)).size).toBe(200);
  expect(originals.length + replays.length + conflicts.length).toBe(2000);
  // A replay carries the original's body, whichever process ran it.
  const bodyOf = new Map(originals.map((r) => [r.key, r.body]));
  for (const r of replays) expect(r.body).toBe(bodyOf.get(r.key));
  // Executions came from more than one process, so the duplicates really raced across processes. Which
  // processes win is the scheduler's choice: on a loaded machine one can lose every race.
  const pids = new Set(originals.map((r) => (JSON.parse(r.body) as { pid: number }).pid));
  expect(pids.size).toBeGreaterThanOrEqual(2);
  console.log(
    `multi-process: ${originals.length} executions, ${replays.length} replays, ${conflicts.length} conflicts`,
  );
});
