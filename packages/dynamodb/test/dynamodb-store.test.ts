import {
  CreateTableCommand,
  DescribeTableCommand,
  DescribeTimeToLiveCommand,
  DynamoDBClient,
  GetItemCommand,
  UpdateTimeToLiveCommand,
} from '@aws-sdk/client-dynamodb';
import type { StoredResponse } from '@oncely/core';
import { IdempotencyOptionsError } from '@oncely/core';
import { idempotency } from '@oncely/express';
import { freePort } from '@oncely/testing';
import express from 'express';
import request from 'supertest';
import { DynamoDBStore, type DynamoDBStoreOptions } from '../src';
import { CREDENTIALS, type LocalDynamoDB, REGION, randomTableName, sleep, startDynalite } from './helpers';

let local: LocalDynamoDB;
let client: DynamoDBClient;
let store: DynamoDBStore;
const tableName = randomTableName();
const lock = { fingerprint: 'fp', lockTimeoutMs: 30_000 };
const response = (text: string): StoredResponse => ({
  status: 201,
  headers: { 'content-type': 'text/plain', 'x-multi': ['a', 'b'] },
  body: new TextEncoder().encode(text),
});
const bodyText = (r: StoredResponse | undefined) => Buffer.from(r?.body ?? []).toString();

async function rawItem(key: string, prefix = 'oncely:') {
  const { Item } = await client.send(
    new GetItemCommand({ TableName: tableName, Key: { pk: { S: prefix + key } }, ConsistentRead: true }),
  );
  return Item;
}

beforeAll(async () => {
  local = await startDynalite({ returnOldItem: true });
  client = local.client();
  store = new DynamoDBStore({ client, tableName });
  await store.createTable();
});
afterAll(() => local.stop());

describe('options', () => {
  const valid = () => ({ client, tableName });
  test.each<[string, Partial<Record<keyof DynamoDBStoreOptions, unknown>>]>([
    ['client', { client: undefined }],
    ['client', { client: { query: () => {} } }],
    ['tableName', { tableName: undefined }],
    ['tableName', { tableName: 'no spaces allowed' }],
    ['tableName', { tableName: 'ab' }],
    ['prefix', { prefix: 42 }],
    ['partitionKey', { partitionKey: '' }],
    ['partitionKey', { partitionKey: 'token' }],
    ['ttlAttribute', { ttlAttribute: 'expiresAt' }],
    ['ttlAttribute', { ttlAttribute: 'pk' }],
    ['largeBodies', { largeBodies: 'drop' }],
  ])('a bad %s is refused at construction, naming the option', (option, override) => {
    const options = { ...valid(), ...override } as unknown as DynamoDBStoreOptions;
    expect(() => new DynamoDBStore(options)).toThrow(`option "${option}"`);
    expect(() => new DynamoDBStore(options)).toThrow(expect.objectContaining({ option }));
    expect(() => new DynamoDBStore(options)).toThrow(IdempotencyOptionsError);
  });

  test('missing options are refused with an example', () => {
    expect(() => new DynamoDBStore(undefined as unknown as DynamoDBStoreOptions)).toThrow(
      /new DynamoDBStore\(\{ client/,
    );
  });

  test('prefix, partitionKey and ttlAttribute shape the items', async () => {
    const name = randomTableName();
    const custom = new DynamoDBStore({
      client,
      tableName: name,
      prefix: 'app:',
      partitionKey: 'id',
      ttlAttribute: 'exp',
    });
    await custom.createTable();
    const first = await custom.acquire('k', lock);
    if (first.status !== 'acquired') throw new Error('expected acquired');
    const { Item } = await client.send(
      new GetItemCommand({ TableName: name, Key: { id: { S: 'app:k' } }, ConsistentRead: true }),
    );
    expect(Item?.token?.S).toBe(first.token);
    expect(Number(Item?.exp?.N)).toBe(Math.ceil(Number(Item?.expiresAt?.N) / 1000));
  });
});

describe('createTable()', () => {
  test('creates an on-demand table keyed by pk (S), and is safe to run again', async () => {
    const name = randomTableName();
    const fresh = new DynamoDBStore({ client, tableName: name });
    // dynalite has no UpdateTimeToLive: reported, not hidden.
    expect(await fresh.createTable()).toEqual({ created: true, timeToLive: 'unsupported' });
    expect(await fresh.createTable()).toEqual({ created: false, timeToLive: 'unsupported' });
    const { Table } = await client.send(new DescribeTableCommand({ TableName: name }));
    expect(Table?.TableStatus).toBe('ACTIVE');
    expect(Table?.KeySchema).toEqual([{ AttributeName: 'pk', KeyType: 'HASH' }]);
    expect(Table?.AttributeDefinitions).toEqual([{ AttributeName: 'pk', AttributeType: 'S' }]);
    expect(Table?.BillingModeSummary?.BillingMode).toBe('PAY_PER_REQUEST');
  });

  test('an existing table with another key is an error naming partitionKey', async () => {
    const name = randomTableName();
    await client.send(
      new CreateTableCommand({
        TableName: name,
        AttributeDefinitions: [{ AttributeName: 'id', AttributeType: 'S' }],
        KeySchema: [{ AttributeName: 'id', KeyType: 'HASH' }],
        BillingMode: 'PAY_PER_REQUEST',
      }),
    );
    await expect(new DynamoDBStore({ client, tableName: name }).createTable()).rejects.toThrow(
      /option "partitionKey"/,
    );
  });

  // dynalite cannot answer these (its DescribeTimeToLive always says DISABLED): a scripted client plays
  // DynamoDB's answers, and the test checks what the store sends.
  function scripted(ttl: { TimeToLiveStatus: string; AttributeName?: string }) {
    const sent: unknown[] = [];
    const fake = {
      send: async (command: unknown) => {
        sent.push(command);
        if (command instanceof CreateTableCommand) return {};
        if (command instanceof DescribeTableCommand) {
          return {
            Table: {
              TableStatus: 'ACTIVE',
              KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
              AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
            },
          };
        }
        if (command instanceof DescribeTimeToLiveCommand) return { TimeToLiveDescription: ttl };
        if (command instanceof UpdateTimeToLiveCommand) return {};
        throw new Error('unexpected command');
      },
    };
    return {
      store: new DynamoDBStore({ client: fake as unknown as DynamoDBClient, tableName: 'records' }),
      sent,
    };
  }

  test('turns TTL on for ttlAttribute with UpdateTimeToLive', async () => {
    const { store: s, sent } = scripted({ TimeToLiveStatus: 'DISABLED' });
    expect(await s.createTable()).toEqual({ created: true, timeToLive: 'enabled' });
    const update = sent.find((c) => c instanceof UpdateTimeToLiveCommand) as UpdateTimeToLiveCommand;
    expect(update.input).toEqual({
      TableName: 'records',
      TimeToLiveSpecification: { AttributeName: 'ttl', Enabled: true },
    });
  });

  test('leaves TTL alone when it is already on for ttlAttribute', async () => {
    const { store: s, sent } = scripted({ TimeToLiveStatus: 'ENABLED', AttributeName: 'ttl' });
    expect(await s.createTable()).toEqual({ created: true, timeToLive: 'enabled' });
    expect(sent.some((c) => c instanceof UpdateTimeToLiveCommand)).toBe(false);
  });

  test('TTL on another attribute is an error naming ttlAttribute', async () => {
    const { store: s } = scripted({ TimeToLiveStatus: 'ENABLED', AttributeName: 'expiration' });
    await expect(s.createTable()).rejects.toThrow(/"expiration".*option "ttlAttribute"/);
  });
});

describe('items', () => {
  test('in progress: lease end in ms as lockExpiresAt and expiresAt, TTL attribute in seconds', async () => {
    const before = Date.now();
    const first = await store.acquire('layout-p', { fingerprint: 'fp-layout', lockTimeoutMs: 10_000 });
    if (first.status !== 'acquired') throw new Error('expected acquired');
    const item = await rawItem('layout-p');
    expect(item?.state?.S).toBe('in_progress');
    expect(item?.fingerprint?.S).toBe('fp-layout');
    expect(item?.token?.S).toBe(first.token);
    const lease = Number(item?.lockExpiresAt?.N);
    expect(lease).toBeGreaterThanOrEqual(before + 10_000);
    expect(lease).toBeLessThanOrEqual(Date.now() + 10_000);
    expect(item?.expiresAt?.N).toBe(item?.lockExpiresAt?.N);
    expect(Number(item?.ttl?.N)).toBe(Math.ceil(lease / 1000));
  });

  test('completed: body as binary, headers as JSON, TTL end; the lease is gone', async () => {
    const first = await store.acquire('layout-c', lock);
    if (first.status !== 'acquired') throw new Error('expected acquired');
    const body = new Uint8Array([0, 255, 128, 10, 13]);
    const before = Date.now();
    const stored = { status: 202, headers: { 'x-multi': ['a', 'b'], etag: '"e"' }, body };
    expect(await store.complete('layout-c', first.token, stored, 60_000)).toBe(true);
    const item = await rawItem('layout-c');
    expect(item?.state?.S).toBe('completed');
    expect(Buffer.from(item?.body?.B ?? []).equals(Buffer.from(body))).toBe(true);
    expect(JSON.parse(item?.headers?.S ?? '')).toEqual(stored.headers);
    expect(item?.status?.N).toBe('202');
    expect(item?.lockExpiresAt).toBeUndefined();
    expect(Number(item?.expiresAt?.N)).toBeGreaterThanOrEqual(before + 60_000);
    expect(Number(item?.ttl?.N)).toBe(Math.ceil(Number(item?.expiresAt?.N) / 1000));
  });

  test('an empty body is stored as no attribute and replays as zero bytes', async () => {
    const first = await store.acquire('layout-empty', lock);
    if (first.status !== 'acquired') throw new Error('expected acquired');
    const empty = { status: 204, headers: {}, body: new Uint8Array(0) };
    expect(await store.complete('layout-empty', first.token, empty, 60_000)).toBe(true);
    expect((await rawItem('layout-empty'))?.body).toBeUndefined();
    const again = await store.acquire('layout-empty', lock);
    if (again.status !== 'completed') throw new Error('expected completed');
    expect(again.response.body.byteLength).toBe(0);
    expect(again.response.status).toBe(204);
  });

  test('a key longer than the 2048-byte partition key limit is refused before any request', async () => {
    await expect(store.acquire('k'.repeat(2048), lock)).rejects.toThrow(/2048-byte partition key/);
  });
});

describe('expired items (DynamoDB deletes them late, dynalite never)', () => {
  test('a completed record past its TTL is absent for get() and dead for acquire, though still in the table', async () => {
    const first = await store.acquire('expired', lock);
    if (first.status !== 'acquired') throw new Error('expected acquired');
    expect(await store.complete('expired', first.token, response('old'), 100)).toBe(true);
    await sleep(250);
    expect((await rawItem('expired'))?.state?.S).toBe('completed');
    expect(await store.get('expired')).toBeUndefined();
    const second = await store.acquire('expired', { fingerprint: 'fp-new', lockTimeoutMs: 30_000 });
    if (second.status !== 'acquired') throw new Error(`expected acquired, got ${second.status}`);
    const item = await rawItem('expired');
    expect(item?.state?.S).toBe('in_progress');
    expect(item?.fingerprint?.S).toBe('fp-new');
    // The takeover replaced the whole item: nothing of the old response is left.
    expect(item?.body).toBeUndefined();
    expect(item?.headers).toBeUndefined();
  });

  test('an in-progress record whose lease ended is absent for get()', async () => {
    const first = await store.acquire('expired-lease', { fingerprint: 'fp', lockTimeoutMs: 100 });
    expect(first.status).toBe('acquired');
    await sleep(250);
    expect((await rawItem('expired-lease'))?.state?.S).toBe('in_progress');
    expect(await store.get('expired-lease')).toBeUndefined();
  });
});

describe('a stale owner cannot overwrite or delete the new owner (the Powertools bug)', () => {
  test("A pauses past its lease, B takes over: A's late complete, release and renew all fail; B's record stays", async () => {
    const a = await store.acquire('stale', { fingerprint: 'fp-a', lockTimeoutMs: 200 });
    if (a.status !== 'acquired') throw new Error('expected acquired');
    await sleep(400); // A is frozen (a Lambda paused, a GC pause, a slow downstream call)
    const b = await store.acquire('stale', { fingerprint: 'fp-b', lockTimeoutMs: 30_000 });
    if (b.status !== 'acquired') throw new Error(`expected a takeover, got ${b.status}`);

    expect(await store.complete('stale', a.token, response('from A'), 60_000)).toBe(false);
    expect(await store.release('stale', a.token)).toBe(false);
    expect(await store.renew('stale', a.token, 30_000)).toBe(false);
    const during = await rawItem('stale');
    expect(during).toMatchObject({
      state: { S: 'in_progress' },
      token: { S: b.token },
      fingerprint: { S: 'fp-b' },
    });

    expect(await store.complete('stale', b.token, response('from B'), 60_000)).toBe(true);
    // A wakes again, after B completed: still refused, B's response stays.
    expect(await store.complete('stale', a.token, response('from A, again'), 60_000)).toBe(false);
    expect(await store.release('stale', a.token)).toBe(false);
    const replay = await store.acquire('stale', lock);
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(bodyText(replay.response)).toBe('from B');
    expect(replay.fingerprint).toBe('fp-b');
  });
});

describe('requests retried or lost in flight', () => {
  // Sends the store's first command of `name` twice, as the SDK does when a response is lost after DynamoDB
  // applied the write; returns the second answer.
  function duplicateOnce(c: DynamoDBClient, name: string): void {
    let done = false;
    c.middlewareStack.add(
      (next, context) => async (args) => {
        if (done || context.commandName !== name) return next(args);
        done = true;
        await next(args);
        return next(args);
      },
      { step: 'initialize', name: `duplicate${name}` },
    );
  }

  test('an acquire applied, then retried after a lost response, still holds the key', async () => {
    const c = local.client();
    duplicateOnce(c, 'UpdateItemCommand');
    const s = new DynamoDBStore({ client: c, tableName });
    const first = await s.acquire('retried-acquire', lock);
    if (first.status !== 'acquired') throw new Error(`expected acquired, got ${first.status}`);
    expect((await rawItem('retried-acquire'))?.token?.S).toBe(first.token);
    expect(await s.complete('retried-acquire', first.token, response('once'), 60_000)).toBe(true);
  });

  test('a complete applied, then retried after a lost response, resolves true', async () => {
    const c = local.client();
    duplicateOnce(c, 'UpdateItemCommand');
    const s = new DynamoDBStore({ client: c, tableName });
    const first = await s.acquire('retried-complete', lock);
    if (first.status !== 'acquired') throw new Error('expected acquired');
    expect(await s.complete('retried-complete', first.token, response('once'), 60_000)).toBe(true);
    // A second complete call with the same token is still refused: it is not the same write.
    expect(await s.complete('retried-complete', first.token, response('twice'), 60_000)).toBe(false);
    expect(bodyText((await s.get('retried-complete'))?.response)).toBe('once');
  });

  test('an acquire that fails after DynamoDB applied it releases its orphan lease', async () => {
    const c = local.client();
    let fail = true;
    c.middlewareStack.add(
      (next, context) => async (args) => {
        const result = await next(args);
        if (fail && context.commandName === 'UpdateItemCommand') {
          fail = false;
          throw Object.assign(new Error('socket hang up'), { name: 'TimeoutError' });
        }
        return result;
      },
      { step: 'initialize', name: 'loseResponse' },
    );
    const s = new DynamoDBStore({ client: c, tableName });
    await expect(s.acquire('orphan', lock)).rejects.toThrow('socket hang up');
    // Released: over at once (the item stays until DynamoDB's TTL deletion, which dynalite never runs).
    for (let i = 0; i < 50 && (await rawItem('orphan'))?.state?.S !== 'released'; i++) await sleep(20);
    expect((await rawItem('orphan'))?.state?.S).toBe('released');
    expect(await store.get('orphan')).toBeUndefined();
    expect((await s.acquire('orphan', lock)).status).toBe('acquired');
  });
});

describe('delete()', () => {
  test('removes a live record; false when there is none', async () => {
    const first = await store.acquire('del', lock);
    if (first.status !== 'acquired') throw new Error('expected acquired');
    expect(await store.delete('del')).toBe(true);
    expect(await rawItem('del')).toBeUndefined();
    expect(await store.delete('del')).toBe(false);
  });
});

describe('outage', () => {
  test('an unreachable DynamoDB answers 503 at once; the handler does not run', async () => {
    const down = new DynamoDBClient({
      endpoint: `http://127.0.0.1:${await freePort()}`, // nothing listens there
      region: REGION,
      credentials: CREDENTIALS,
      maxAttempts: 1,
    });
    try {
      const app = express();
      app.use(idempotency({ store: new DynamoDBStore({ client: down, tableName }) }));
      let runs = 0;
      app.post('/charges', (_req, res) => {
        runs++;
        res.status(201).json({ ok: true });
      });
      const started = Date.now();
      const res = await request(app).post('/charges').set('Idempotency-Key', 'outage');
      expect(res.status).toBe(503);
      expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
      expect(runs).toBe(0);
      expect(Date.now() - started).toBeLessThan(5_000);
    } finally {
      down.destroy();
    }
  });
});
