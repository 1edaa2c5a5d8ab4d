import { storeContractSuite } from '@oncely/testing';
import { DynamoDBStore } from '../src';
import { countCommands, type LocalDynamoDB, randomTableName, startDynalite } from './helpers';

// The shared store contract on dynalite, with DynamoDB's ReturnValuesOnConditionCheckFailure emulated (helpers.ts):
// the path the store takes on AWS.
let local: LocalDynamoDB;
const tableName = randomTableName();

beforeAll(async () => {
  local = await startDynalite({ returnOldItem: true });
  await new DynamoDBStore({ client: local.client(), tableName }).createTable();
});
afterAll(() => local.stop());

storeContractSuite('DynamoDBStore', {
  create: () => new DynamoDBStore({ client: local.client(), tableName }),
  // The clients are destroyed with the server in afterAll.
  destroy: () => {},
  // dynalite answers in this process: on a loaded machine the round trips of a check within a 150 ms TTL (the
  // default) often take longer, on every attempt.
  shortMs: 400,
});

describe('DynamoDBStore with ReturnValuesOnConditionCheckFailure', () => {
  test('a duplicate learns the record from the failed write itself: one request, no read', async () => {
    const client = local.client();
    const counts = countCommands(client);
    const store = new DynamoDBStore({ client, tableName });
    const first = await store.acquire('dup', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    if (first.status !== 'acquired') throw new Error(`expected acquired, got ${first.status}`);
    const during = await store.acquire('dup', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    expect(during.status).toBe('in_progress');
    const body = new TextEncoder().encode('{"ok":true}');
    expect(await store.complete('dup', first.token, { status: 201, headers: {}, body }, 60_000)).toBe(true);
    const replay = await store.acquire('dup', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    if (replay.status !== 'completed') throw new Error(`expected completed, got ${replay.status}`);
    expect(Buffer.from(replay.response.body).toString()).toBe('{"ok":true}');
    // Three acquires and a complete, all UpdateItem.
    expect(Object.fromEntries(counts)).toEqual({ UpdateItemCommand: 4 });
  });
});
