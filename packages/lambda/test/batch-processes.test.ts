/**
 * @services redis
 */
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { type ConsumerProcess, startConsumerProcess, waitUntil } from '@oncely/testing';
import type { SQSRecord } from 'aws-lambda';
import Redis from 'ioredis';
import { type LocalDynamoDB, randomTableName, startDynalite } from '../../dynamodb/test/helpers';
import { redelivered, sqsEvent, sqsRecord } from './batch-events';
import { deletePrefixes, REDIS_URL } from './batch-stores';

// Lambda functions in processes of their own (one per execution environment), sharing the Redis on this machine or a
// DynamoDB table (dynalite, served from this process): concurrent duplicate batches, and an invocation that runs out
// of time and is killed. Each process takes invocations from a Redis list (test/fixtures/batch-invoker.ts) and
// counts its runs and side effects there, under a random prefix deleted in afterAll.
jest.setTimeout(120_000);

const script = join(__dirname, 'fixtures', 'batch-invoker.ts');
const run = randomUUID().slice(0, 8);
const prefixes: string[] = [];
const processes: ConsumerProcess[] = [];
const readers = new Set<Redis>();
let redis: Redis;
let dynamo: LocalDynamoDB;
const tableName = randomTableName();

interface Answer {
  name: string;
  response?: { batchItemFailures: Array<{ itemIdentifier: string }> };
  error?: string;
}

beforeAll(async () => {
  redis = new Redis(REDIS_URL);
  dynamo = await startDynalite({ returnOldItem: true });
  const { DynamoDBStore } = await import('@oncely/dynamodb');
  await new DynamoDBStore({ client: dynamo.client(), tableName }).createTable();
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill()));
  for (const reader of readers) reader.disconnect();
  await deletePrefixes(redis, prefixes);
  await redis.quit();
  await dynamo.stop();
});

interface Functions {
  prefix: string;
  names: string[];
  byName: Map<string, ConsumerProcess>;
  /** Invokes function `name` with `records`, its invocation ending `remainingMs` from now. */
  invoke(name: string, records: SQSRecord[], remainingMs?: number): Promise<Answer>;
  count(hash: 'runs' | 'effects', body: string): Promise<number>;
}

async function startFunctions(
  label: string,
  store: 'redis' | 'dynamodb',
  processCount: number,
  extra: Record<string, string> = {},
): Promise<Functions> {
  const prefix = `oncely-lambda-test:${run}:${label}:`;
  prefixes.push(prefix);
  const names = Array.from({ length: processCount }, (_, i) => `fn${i}`);
  const byName = new Map<string, ConsumerProcess>();
  // One after another: started together on a loaded machine, they compete for it and start slower than all.
  for (const name of names) {
    const p = await startConsumerProcess(script, {
      PREFIX: prefix,
      NAME: name,
      STORE: store,
      REDIS_URL,
      DYNAMODB_ENDPOINT: dynamo.endpoint,
      TABLE: tableName,
      ...extra,
    });
    processes.push(p);
    byName.set(name, p);
  }
  const invoke = async (name: string, records: SQSRecord[], remainingMs = 60_000): Promise<Answer> => {
    const id = randomUUID();
    const reader = new Redis(REDIS_URL);
    readers.add(reader);
    try {
      await redis.rpush(
        `${prefix}inbox:${name}`,
        JSON.stringify({ id, event: sqsEvent(records), remainingMs }),
      );
      const popped = await reader.blpop(`${prefix}outbox:${id}`, 60);
      if (popped === null) throw new Error(`${name} did not answer`);
      return JSON.parse(popped[1]) as Answer;
    } finally {
      readers.delete(reader);
      reader.disconnect();
    }
  };
  const count = async (hash: 'runs' | 'effects', body: string) =>
    Number((await redis.hget(`${prefix}${hash}`, body)) ?? 0);
  return { prefix, names, byName, invoke, count };
}

const reportedIds = (answer: Answer): string[] => {
  if (answer.error !== undefined) throw new Error(`${answer.name} failed: ${answer.error}`);
  return (answer.response?.batchItemFailures ?? []).map((f) => f.itemIdentifier);
};

describe.each<['redis' | 'dynamodb']>([['redis'], ['dynamodb']])('processes sharing %s', (store) => {
  test('concurrent duplicate batches in four processes: one execution per key; redelivered, none runs again', async () => {
    const fns = await startFunctions(`dup-${store}`, store, 4);
    const keys = Array.from({ length: 25 }, (_, i) => `order-${i}`);
    // Each process gets every order, sent again (its own message ids), in its own order, all at once.
    const batches = fns.names.map((_, n) => {
      const records = keys.map((key) => sqsRecord({ body: key, key }));
      return n % 2 === 0 ? records : records.reverse();
    });
    const answers = await Promise.all(
      fns.names.map((name, n) => fns.invoke(name, batches[n] as SQSRecord[])),
    );
    for (const key of keys) expect(await fns.count('effects', key)).toBe(1);

    // Lambda delivers the reported records again (to any environment) until none is reported.
    let pending = batches.flatMap((records, n) => {
      const reported = new Set(reportedIds(answers[n] as Answer));
      return records.filter((r) => reported.has(r.messageId));
    });
    for (let round = 0; pending.length > 0 && round < 10; round++) {
      const again = pending.map(redelivered);
      const answer = await fns.invoke(fns.names[round % fns.names.length] as string, again);
      const reported = new Set(reportedIds(answer));
      pending = again.filter((r) => reported.has(r.messageId));
    }
    expect(pending).toEqual([]);
    for (const key of keys) {
      expect(await fns.count('effects', key)).toBe(1);
      expect(await fns.count('runs', key)).toBe(1);
    }
  });

  test('an invocation that runs out of time and is SIGKILLed: the retry takes over once its time is up', async () => {
    const fns = await startFunctions(`kill-${store}`, store, 2, { HANG_BODY: 'slow', HANG_IN: 'fn0' });
    const [first, second] = fns.names as [string, string];
    const record = sqsRecord({ body: 'slow', key: 'slow-order' });
    const remainingMs = 4000;
    const started = Date.now();
    // Never answered: its process is killed below.
    const killed = fns.invoke(first, [record], remainingMs).catch(() => undefined);
    await waitUntil(
      async () => (await redis.get(`${fns.prefix}hanging:${first}`)) !== null,
      'the first to hang',
    );
    // Lambda's timeout: the environment is gone mid-record, before its side effect.
    await fns.byName.get(first)?.kill();

    // Delivered again at once: the key is still held by the dead invocation's lease, so it is reported.
    const early = await fns.invoke(second, [redelivered(record)]);
    expect(reportedIds(early)).toEqual([record.messageId]);
    expect(await fns.count('effects', 'slow')).toBe(0);

    // Once the dead invocation's time (and the margin) is up, a delivery takes the key over and runs it: well
    // before lockTimeout's default of 30 s.
    let answer: Answer | undefined;
    await waitUntil(
      async () => {
        answer = await fns.invoke(second, [redelivered(record)]);
        return reportedIds(answer).length === 0;
      },
      'the retry to take the key over',
      15_000,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(remainingMs);
    expect(await fns.count('effects', 'slow')).toBe(1);
    expect(await redis.lrange(`${fns.prefix}effects-by`, 0, -1)).toEqual([`slow ${second}`]);
    for (const reader of readers) reader.disconnect();
    await killed;
  });

  test('a timed-out invocation that wakes up after the retry took over is fenced: it cannot overwrite the record', async () => {
    const fns = await startFunctions(`fence-${store}`, store, 2, { HANG_BODY: 'stale', HANG_IN: 'fn0' });
    const [first, second] = fns.names as [string, string];
    const record = sqsRecord({ body: 'stale', key: 'stale-order' });
    const stale = fns.invoke(first, [record], 1000);
    await waitUntil(
      async () => (await redis.get(`${fns.prefix}hanging:${first}`)) !== null,
      'the first to hang',
    );
    // The first is still alive (its heartbeat renews the lease, but never past its deadline): the retry takes over
    // once that passed, and does the work.
    await waitUntil(
      async () => reportedIds(await fns.invoke(second, [redelivered(record)])).length === 0,
      'the retry to take the key over',
      15_000,
    );
    // The stale invocation wakes up, does its (now duplicate) side effect and tries to complete: refused.
    await redis.del(`${fns.prefix}hanging:${first}`);
    await stale;
    await waitUntil(
      async () => (await redis.llen(`${fns.prefix}fenced`)) > 0,
      'the stale invocation to be fenced',
    );
    const fenced = await redis.lrange(`${fns.prefix}fenced`, 0, -1);
    expect(fenced.every((line) => line.startsWith(`${first} `))).toBe(true);
    expect(fenced.some((line) => line.includes(' complete ') || line.includes(' renew '))).toBe(true);
    // The record is the retry's: a further delivery replays it, nothing runs.
    const runsBefore = await fns.count('runs', 'stale');
    expect(reportedIds(await fns.invoke(second, [redelivered(record)]))).toEqual([]);
    expect(await fns.count('runs', 'stale')).toBe(runsBefore);
  });
});
