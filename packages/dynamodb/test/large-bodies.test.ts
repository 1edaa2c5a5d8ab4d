import { randomBytes } from 'node:crypto';
import { type DynamoDBClient, GetItemCommand, PutItemCommand } from '@aws-sdk/client-dynamodb';
import { idempotency } from '@oncely/express';
import { binaryParser } from '@oncely/testing';
import express from 'express';
import request from 'supertest';
import { DynamoDBStore } from '../src';
import { CHUNK_BYTES, completedItemBytes, MAX_CHUNKS, MAX_ITEM_BYTES } from '../src/items';
import { type LocalDynamoDB, randomTableName, sleep, startDynalite } from './helpers';

// DynamoDB's 400 KB item limit, which dynalite enforces as DynamoDB does.
let local: LocalDynamoDB;
let client: DynamoDBClient;
const tableName = randomTableName();
const lock = { fingerprint: 'fp', lockTimeoutMs: 30_000 };
const headers = { 'content-type': 'application/octet-stream' };

async function rawItem(key: string) {
  const { Item } = await client.send(
    new GetItemCommand({ TableName: tableName, Key: { pk: { S: `oncely:${key}` } }, ConsistentRead: true }),
  );
  return Item;
}

async function completeWith(store: DynamoDBStore, key: string, body: Uint8Array, fingerprint = 'fp') {
  const first = await store.acquire(key, { fingerprint, lockTimeoutMs: 30_000 });
  if (first.status !== 'acquired') throw new Error(`expected acquired, got ${first.status}`);
  return store.complete(key, first.token, { status: 200, headers, body }, 60_000);
}

/** The largest body that fits in the record item with `headers`, for key `key`. */
function largestInline(key: string): number {
  const overhead = completedItemBytes(
    { partitionKey: 'pk', ttlAttribute: 'ttl' },
    `oncely:${key}`,
    '00000000-0000-0000-0000-000000000000',
    '00000000-0000-0000-0000-000000000000',
    JSON.stringify(headers),
    0,
  );
  return MAX_ITEM_BYTES - overhead;
}

beforeAll(async () => {
  local = await startDynalite({ returnOldItem: true });
  client = local.client();
  await new DynamoDBStore({ client, tableName }).createTable();
});
afterAll(() => local.stop());

test('the local DynamoDB enforces the 400 KB item limit', async () => {
  const put = (size: number) =>
    client.send(
      new PutItemCommand({
        TableName: tableName,
        Item: { pk: { S: 'raw' }, b: { B: new Uint8Array(size) } },
      }),
    );
  await expect(put(MAX_ITEM_BYTES - 100)).resolves.toBeDefined();
  await expect(put(MAX_ITEM_BYTES + 1)).rejects.toThrow(/size/i);
});

describe("largeBodies: 'chunk' (default)", () => {
  let store: DynamoDBStore;
  beforeAll(() => {
    store = new DynamoDBStore({ client, tableName });
  });

  test('the largest body that fits stays in the record item; one byte more goes to chunk items', async () => {
    const fits = randomBytes(largestInline('edge-in'));
    expect(await completeWith(store, 'edge-in', fits)).toBe(true);
    const inline = await rawItem('edge-in');
    expect(inline?.body?.B?.byteLength).toBe(fits.byteLength);
    expect(inline?.bodyChunks).toBeUndefined();

    const over = randomBytes(largestInline('edge-out') + 1);
    expect(await completeWith(store, 'edge-out', over)).toBe(true);
    const chunked = await rawItem('edge-out');
    expect(chunked?.body).toBeUndefined();
    expect(chunked?.bodyChunks?.N).toBe('2');
    expect(chunked?.bodyBytes?.N).toBe(String(over.byteLength));
    const replay = await store.acquire('edge-out', lock);
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(Buffer.from(replay.response.body).equals(over)).toBe(true);
  });

  test('a 1 MiB body round-trips through three chunk items, for acquire and get', async () => {
    const body = randomBytes(1024 * 1024);
    const before = await local.countItems(tableName, 'oncely:chunk:');
    expect(await completeWith(store, 'mib', body)).toBe(true);
    expect((await local.countItems(tableName, 'oncely:chunk:')) - before).toBe(3);
    const replay = await store.acquire('mib', lock);
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(Buffer.from(replay.response.body).equals(body)).toBe(true);
    expect(replay.response.headers).toEqual(headers);
    const record = await store.get('mib');
    expect(Buffer.from(record?.response?.body ?? []).equals(body)).toBe(true);
  });

  test('delete() removes the chunk items with the record', async () => {
    const body = randomBytes(CHUNK_BYTES * 2 + 10);
    const before = await local.countItems(tableName, 'oncely:chunk:');
    expect(await completeWith(store, 'del-chunks', body)).toBe(true);
    expect((await local.countItems(tableName, 'oncely:chunk:')) - before).toBe(3);
    expect(await store.delete('del-chunks')).toBe(true);
    expect(await local.countItems(tableName, 'oncely:chunk:')).toBe(before);
    expect(await store.get('del-chunks')).toBeUndefined();
  });

  test("a fenced-off owner's chunks are removed, and the new owner's record is untouched", async () => {
    const a = await store.acquire('stale-big', { fingerprint: 'fp-a', lockTimeoutMs: 200 });
    if (a.status !== 'acquired') throw new Error('expected acquired');
    await sleep(400);
    const b = await store.acquire('stale-big', { fingerprint: 'fp-b', lockTimeoutMs: 30_000 });
    if (b.status !== 'acquired') throw new Error(`expected a takeover, got ${b.status}`);
    const before = await local.countItems(tableName, 'oncely:chunk:');
    const late = { status: 200, headers, body: randomBytes(CHUNK_BYTES * 2) };
    expect(await store.complete('stale-big', a.token, late, 60_000)).toBe(false);
    // The clean-up runs behind the answer.
    for (let i = 0; i < 50 && (await local.countItems(tableName, 'oncely:chunk:')) > before; i++)
      await sleep(20);
    expect(await local.countItems(tableName, 'oncely:chunk:')).toBe(before);
    expect(await store.get('stale-big')).toMatchObject({ state: 'in_progress', token: b.token });
  });

  test('a custom fingerprint longer than the size allowance still completes: the body moves to chunks', async () => {
    const fingerprint = 'f'.repeat(4096);
    const body = randomBytes(largestInline('long-fp'));
    expect(await completeWith(store, 'long-fp', body, fingerprint)).toBe(true);
    expect((await rawItem('long-fp'))?.bodyChunks?.N).toBe('2');
    const replay = await store.acquire('long-fp', { fingerprint, lockTimeoutMs: 30_000 });
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(replay.fingerprint).toBe(fingerprint);
    expect(Buffer.from(replay.response.body).equals(body)).toBe(true);
  });

  test('a body above 25 chunks is stored without it, marked for the engine', async () => {
    const before = await local.countItems(tableName, 'oncely:chunk:');
    const body = new Uint8Array(CHUNK_BYTES * MAX_CHUNKS + 1);
    expect(await completeWith(store, 'too-big', body)).toBe(true);
    expect(await local.countItems(tableName, 'oncely:chunk:')).toBe(before);
    const replay = await store.acquire('too-big', lock);
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(replay.response.status).toBe(200);
    expect(replay.response.body.byteLength).toBe(0);
    expect(replay.response.headers).toEqual({ ...headers, 'x-oncely-body-omitted': '1' });
  });

  test('batch entries DynamoDB leaves unprocessed (throttling) are sent again until done', async () => {
    // Plays DynamoDB under throttling: each batch call processes only its first entry and hands back the rest.
    const c = local.client();
    const calls = { BatchWriteItemCommand: 0, BatchGetItemCommand: 0 };
    c.middlewareStack.add(
      (next, context) => async (args) => {
        const name = context.commandName;
        if (name !== 'BatchWriteItemCommand' && name !== 'BatchGetItemCommand') return next(args);
        calls[name]++;
        const input = args.input as {
          RequestItems: Record<string, { Keys: unknown[] } | unknown[]>;
        };
        const entries = input.RequestItems[tableName];
        const list = Array.isArray(entries) ? entries : (entries?.Keys ?? []);
        if (list.length <= 1) return next(args);
        const [head, ...rest] = list;
        const result = await next({
          ...args,
          input: {
            RequestItems: {
              [tableName]: Array.isArray(entries) ? [head] : { ...entries, Keys: [head] },
            },
          },
        });
        const output = result.output as unknown as Record<string, unknown>;
        if (Array.isArray(entries)) output.UnprocessedItems = { [tableName]: rest };
        else output.UnprocessedKeys = { [tableName]: { ...entries, Keys: rest } };
        return result;
      },
      { step: 'initialize', name: 'throttleBatches' },
    );
    const throttled = new DynamoDBStore({ client: c, tableName });
    const body = randomBytes(CHUNK_BYTES * 2 + 1);
    expect(await completeWith(throttled, 'throttled', body)).toBe(true);
    expect(calls.BatchWriteItemCommand).toBe(3);
    const replay = await throttled.acquire('throttled', lock);
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(Buffer.from(replay.response.body).equals(body)).toBe(true);
    expect(calls.BatchGetItemCommand).toBe(3);
  });

  test('over HTTP: a 1 MiB response replays byte for byte', async () => {
    const body = randomBytes(1024 * 1024);
    const app = express();
    app.use(idempotency({ store, maxBodyBytes: 2 * 1024 * 1024 }));
    let runs = 0;
    app.post('/export', (_req, res) => {
      runs++;
      res.type('application/octet-stream').send(body);
    });
    const first = await request(app)
      .post('/export')
      .set('Idempotency-Key', 'http-mib')
      .buffer()
      .parse(binaryParser);
    const again = await request(app)
      .post('/export')
      .set('Idempotency-Key', 'http-mib')
      .buffer()
      .parse(binaryParser);
    expect(first.status).toBe(200);
    expect(again.status).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(again.body as Buffer, body)).toBe(0);
    expect(runs).toBe(1);
  });
});

describe("largeBodies: 'omit'", () => {
  let store: DynamoDBStore;
  beforeAll(() => {
    store = new DynamoDBStore({ client, tableName, largeBodies: 'omit' });
  });

  test('a body too large for the item is stored without it, as executed; nothing else is written', async () => {
    const before = await local.countItems(tableName, 'oncely:chunk:');
    expect(await completeWith(store, 'omit-big', randomBytes(500 * 1024))).toBe(true);
    expect(await local.countItems(tableName, 'oncely:chunk:')).toBe(before);
    const item = await rawItem('omit-big');
    expect(item?.body).toBeUndefined();
    const record = await store.get('omit-big');
    expect(record?.state).toBe('completed');
    expect(record?.response?.headers['x-oncely-body-omitted']).toBe('1');
    expect(record?.response?.body.byteLength).toBe(0);
  });

  test('a body that fits is kept as usual', async () => {
    const body = randomBytes(100 * 1024);
    expect(await completeWith(store, 'omit-small', body)).toBe(true);
    const replay = await store.acquire('omit-small', lock);
    if (replay.status !== 'completed') throw new Error('expected completed');
    expect(Buffer.from(replay.response.body).equals(body)).toBe(true);
  });

  test('over HTTP: the first answer is the full response, the replay a 410; the handler ran once', async () => {
    const app = express();
    app.use(idempotency({ store, maxBodyBytes: 2 * 1024 * 1024 }));
    let runs = 0;
    app.post('/report', (_req, res) => {
      runs++;
      res
        .status(201)
        .type('text/plain')
        .send('x'.repeat(500 * 1024));
    });
    const first = await request(app).post('/report').set('Idempotency-Key', 'http-omit');
    expect(first.status).toBe(201);
    expect(first.text).toHaveLength(500 * 1024);
    const again = await request(app).post('/report').set('Idempotency-Key', 'http-omit');
    expect(again.status).toBe(410);
    expect(again.headers['content-type']).toMatch(/application\/problem\+json/);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toMatchObject({ status: 410, originalStatus: 201 });
    expect(runs).toBe(1);
  });
});
