import { type DynamoDBClient, GetItemCommand } from '@aws-sdk/client-dynamodb';
import type { AcquiredResult, AcquireResult } from '@oncely/core';
import { StoreOperationError } from '@oncely/core';
import { DynamoDBStore } from '../src';
import {
  countCommands,
  type LocalDynamoDB,
  randomTableName,
  releasedUnderClockSkew,
  sleep,
  startDynalite,
} from './helpers';

// What the shared suite cannot see: the requests each operation costs, the item's attributes (DynamoDB's TTL
// attribute above all), and the 400 KB item limit, on dynalite with ALL_OLD emulated (the path taken on AWS).
let local: LocalDynamoDB;
let client: DynamoDBClient;
let store: DynamoDBStore;
const tableName = randomTableName();
const LONG = 60_000;
const lease = (fingerprint = 'fp', lockTimeoutMs = 30_000) => ({ fingerprint, lockTimeoutMs });
const response = { status: 201, headers: {}, body: new TextEncoder().encode('{"ok":true}') };

function acquired(result: AcquireResult): AcquiredResult {
  if (result.status !== 'acquired') throw new Error(`expected acquired, got ${result.status}`);
  return result;
}

async function rawItem(key: string) {
  const { Item } = await client.send(
    new GetItemCommand({ TableName: tableName, Key: { pk: { S: `oncely:${key}` } }, ConsistentRead: true }),
  );
  return Item;
}

/** The TTL attribute in ms, and the latest moment the store may still need the item. */
async function ttlAndEnd(key: string): Promise<{ ttlMs: number; needed: number }> {
  const item = await rawItem(key);
  const needed = Math.max(
    Number(item?.expiresAt?.N ?? 0),
    Number(item?.stepsUntil?.N ?? 0),
    Number(item?.lockExpiresAt?.N ?? 0),
  );
  return { ttlMs: Number(item?.ttl?.N) * 1000, needed };
}

beforeAll(async () => {
  local = await startDynalite({ returnOldItem: true });
  client = local.client();
  store = new DynamoDBStore({ client, tableName });
  await store.createTable();
});
afterAll(() => local.stop());

describe('one request per operation', () => {
  test('a record without steps: acquire, renew, release and complete are one UpdateItem each', async () => {
    const c = local.client();
    const counts = countCommands(c);
    const s = new DynamoDBStore({ client: c, tableName });
    const first = acquired(await s.acquire('plain', lease()));
    expect(first.steps).toBeUndefined();
    expect(first.fingerprint).toBeUndefined();
    expect(await s.renew('plain', first.token, 30_000)).toBe(true);
    expect(await s.release('plain', first.token)).toBe(true);
    const second = acquired(await s.acquire('plain', lease()));
    expect(second.steps).toBeUndefined();
    expect(await s.complete('plain', second.token, response, LONG)).toBe(true);
    expect(Object.fromEntries(counts)).toEqual({ UpdateItemCommand: 5 });
  });

  test('with steps: recordStep, release, the resuming acquire, renew and complete are one UpdateItem each', async () => {
    const c = local.client();
    const counts = countCommands(c);
    const s = new DynamoDBStore({ client: c, tableName });
    const first = acquired(await s.acquire('stepped', lease('fp-1')));
    expect(await s.recordStep('stepped', first.token, 'charge', '{"id":"ch_1"}', LONG)).toBe(true);
    expect(await s.recordStep('stepped', first.token, 'email', '', LONG)).toBe(true);
    expect(await s.release('stepped', first.token)).toBe(true);
    const second = acquired(await s.acquire('stepped', lease('fp-2')));
    expect(second.steps).toEqual({ charge: '{"id":"ch_1"}', email: '' });
    expect(second.fingerprint).toBe('fp-1');
    expect(await s.renew('stepped', second.token, 30_000)).toBe(true);
    expect(await s.complete('stepped', second.token, response, LONG)).toBe(true);
    expect(Object.fromEntries(counts)).toEqual({ UpdateItemCommand: 7 });
  });
});

describe('the item', () => {
  test('steps are entries of one map attribute, with their keep-until and fingerprint; complete removes them', async () => {
    const first = acquired(await store.acquire('layout', lease('fp-1')));
    const before = Date.now();
    expect(await store.recordStep('layout', first.token, 'a.b [0] #:x', '"v"', LONG)).toBe(true);
    const item = await rawItem('layout');
    expect(item?.steps?.M).toEqual({ 'a.b [0] #:x': { S: '"v"' } });
    expect(Number(item?.stepsUntil?.N)).toBeGreaterThanOrEqual(before + LONG);
    expect(Number(item?.stepsUntil?.N)).toBeLessThanOrEqual(Date.now() + LONG);
    expect(item?.stepsFingerprint?.S).toBe('fp-1');
    expect(await store.complete('layout', first.token, response, LONG)).toBe(true);
    const done = await rawItem('layout');
    expect(done?.state?.S).toBe('completed');
    for (const name of ['steps', 'stepsUntil', 'stepsTtl', 'stepsFingerprint', 'lockExpiresAt']) {
      expect(done?.[name]).toBeUndefined();
    }
  });

  test("DynamoDB's TTL attribute never falls before the record's end: after each step, renew and release", async () => {
    const first = acquired(await store.acquire('ttl', lease('fp', 2_000)));
    const checks: string[] = [];
    const check = async (when: string) => {
      const { ttlMs, needed } = await ttlAndEnd('ttl');
      if (ttlMs < needed) checks.push(`${when}: TTL attribute ${ttlMs} before the end ${needed}`);
    };
    await check('acquire');
    expect(await store.recordStep('ttl', first.token, 'a', '"A"', LONG)).toBe(true);
    await check('recordStep');
    expect(await store.renew('ttl', first.token, 2_000)).toBe(true);
    await check('renew');
    expect(await store.release('ttl', first.token)).toBe(true);
    expect((await rawItem('ttl'))?.state?.S).toBe('released');
    await check('release');
    const second = acquired(await store.acquire('ttl', lease('fp', 2_000)));
    expect(second.steps).toEqual({ a: '"A"' });
    await check('resume');
    expect(checks).toEqual([]);
    // The released record is kept for the steps' ttl (a minute), not the lease's two seconds.
    expect((await ttlAndEnd('ttl')).ttlMs).toBeGreaterThanOrEqual(Date.now() + LONG - 5_000);
  });

  test('a lease longer than the step ttl: the TTL attribute covers the lease (a second write)', async () => {
    const c = local.client();
    const counts = countCommands(c);
    const s = new DynamoDBStore({ client: c, tableName });
    const first = acquired(await s.acquire('long-lease', lease('fp', 120_000)));
    expect(await s.recordStep('long-lease', first.token, 'a', '"A"', 1_000)).toBe(true);
    const { ttlMs, needed } = await ttlAndEnd('long-lease');
    expect(ttlMs).toBeGreaterThanOrEqual(needed);
    expect(needed).toBeGreaterThanOrEqual(Date.now() + 100_000);
    expect(Object.fromEntries(counts)).toEqual({ UpdateItemCommand: 3 });
  });

  test('a record without steps, released, is over at once and its TTL attribute is now', async () => {
    const first = acquired(await store.acquire('released-plain', lease()));
    const before = Date.now();
    expect(await store.release('released-plain', first.token)).toBe(true);
    const item = await rawItem('released-plain');
    expect(item?.state?.S).toBe('released');
    expect(Number(item?.ttl?.N)).toBeLessThanOrEqual(Math.ceil(Date.now() / 1000));
    expect(Number(item?.ttl?.N)).toBeGreaterThanOrEqual(Math.floor(before / 1000));
    expect(await store.get('released-plain')).toBeUndefined();
    expect(await store.delete('released-plain')).toBe(false);
  });
});

describe('a record with steps past its keep-until (DynamoDB deletes it late, dynalite never)', () => {
  test('acquire replaces it with a PutItem: no old steps, the new fingerprint, the old token fenced', async () => {
    const first = acquired(await store.acquire('dead-steps', lease('fp-old')));
    expect(await store.recordStep('dead-steps', first.token, 'a', '"A"', 100)).toBe(true);
    expect(await store.release('dead-steps', first.token)).toBe(true);
    await sleep(300);
    expect((await rawItem('dead-steps'))?.steps?.M).toEqual({ a: { S: '"A"' } });
    expect(await store.get('dead-steps')).toBeUndefined();
    const c = local.client();
    const counts = countCommands(c);
    const s = new DynamoDBStore({ client: c, tableName });
    const fresh = acquired(await s.acquire('dead-steps', lease('fp-new')));
    expect(fresh.steps).toBeUndefined();
    // The UpdateItem cannot drop the dead steps; its failed condition sends the PutItem that replaces the item.
    expect(Object.fromEntries(counts)).toEqual({ UpdateItemCommand: 1, PutItemCommand: 1 });
    const item = await rawItem('dead-steps');
    expect(item?.fingerprint?.S).toBe('fp-new');
    expect(item?.steps?.M).toEqual({});
    expect(item?.stepsUntil).toBeUndefined();
    expect(item?.stepsFingerprint).toBeUndefined();
    expect(await s.recordStep('dead-steps', first.token, 'b', '"B"', LONG)).toBe(false);
    expect(await s.recordStep('dead-steps', fresh.token, 'b', '"B"', LONG)).toBe(true);
    expect((await s.get('dead-steps'))?.steps).toEqual({ b: '"B"' });
  });
});

describe('the 400 KB item limit', () => {
  test('a step that would push the item past 400 KB is refused with a store error naming it; nothing recorded, the lease kept', async () => {
    const first = acquired(await store.acquire('big', lease()));
    const value = JSON.stringify('x'.repeat(150 * 1024));
    expect(await store.recordStep('big', first.token, 'one', value, LONG)).toBe(true);
    expect(await store.recordStep('big', first.token, 'two', value, LONG)).toBe(true);
    const refused = store.recordStep('big', first.token, 'three', value, LONG);
    await expect(refused).rejects.toThrow(StoreOperationError);
    await expect(refused).rejects.toThrow(/step "three" of key "big" does not fit .*400 KB/);
    await expect(refused).rejects.toMatchObject({ cause: { name: 'ValidationException' } });
    const record = await store.get('big');
    expect(record?.state).toBe('in_progress');
    expect(record?.token).toBe(first.token);
    expect(Object.keys(record?.steps ?? {})).toEqual(['one', 'two']);
    // A smaller step still fits, and complete, which removes the steps in its own write, stores a response
    // larger than what is left beside them (the item is sized after the write).
    expect(await store.recordStep('big', first.token, 'small', '"s"', LONG)).toBe(true);
    const body = new Uint8Array(200 * 1024).fill(7);
    expect(await store.complete('big', first.token, { status: 200, headers: {}, body }, LONG)).toBe(true);
    const item = await rawItem('big');
    expect(item?.body?.B?.byteLength).toBe(body.byteLength);
    expect(item?.bodyChunks).toBeUndefined();
  });

  test('dynalite differs from DynamoDB: it counts UTF-16 units, so 450 KB of UTF-8 in a step passes there', async () => {
    const first = acquired(await store.acquire('utf16', lease()));
    const value = JSON.stringify('€'.repeat(150 * 1024)); // 450 KiB of UTF-8, 150 Ki UTF-16 units
    expect(Buffer.byteLength(value)).toBeGreaterThan(400 * 1024);
    // DynamoDB would refuse this write (ValidationException, a store error from recordStep).
    expect(await store.recordStep('utf16', first.token, 'euros', value, LONG)).toBe(true);
  });
});

releasedUnderClockSkew(() => store);
