import { storeContractSuite } from '@oncely/testing';
import { DynamoDBStore } from '../src';
import {
  countCommands,
  type LocalDynamoDB,
  randomTableName,
  releasedUnderClockSkew,
  startDynalite,
} from './helpers';

// The shared store contract on plain dynalite, which returns no item when a condition fails: the store falls back
// to a strongly consistent GetItem (as it would on any endpoint without ReturnValuesOnConditionCheckFailure).
let local: LocalDynamoDB;
const tableName = randomTableName();

beforeAll(async () => {
  local = await startDynalite({ returnOldItem: false });
  await new DynamoDBStore({ client: local.client(), tableName }).createTable();
});
afterAll(() => local.stop());

storeContractSuite('DynamoDBStore (no ALL_OLD: read fallback)', {
  create: () => new DynamoDBStore({ client: local.client(), tableName }),
  destroy: () => {},
  // dynalite answers in this process: on a loaded machine the round trips of a check within a 150 ms TTL (the
  // default) often take longer, on every attempt.
  shortMs: 400,
});

describe('DynamoDBStore without ReturnValuesOnConditionCheckFailure', () => {
  test('a duplicate costs the failed write plus one consistent read', async () => {
    const client = local.client();
    const counts = countCommands(client);
    const store = new DynamoDBStore({ client, tableName });
    const first = await store.acquire('dup', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    expect(first.status).toBe('acquired');
    const during = await store.acquire('dup', { fingerprint: 'fp', lockTimeoutMs: 30_000 });
    expect(during).toMatchObject({ status: 'in_progress', fingerprint: 'fp' });
    expect(Object.fromEntries(counts)).toEqual({ UpdateItemCommand: 2, GetItemCommand: 1 });
  });
});

// The same on the read fallback: the store judges the item it reads as the failed condition did.
releasedUnderClockSkew(() => new DynamoDBStore({ client: local.client(), tableName }));
