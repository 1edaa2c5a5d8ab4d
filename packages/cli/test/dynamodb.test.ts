import { randomBytes } from 'node:crypto';
import { PutItemCommand } from '@aws-sdk/client-dynamodb';
import { DynamoDBStore } from '@oncely/dynamodb';
import {
  CREDENTIALS,
  type LocalDynamoDB,
  REGION,
  randomTableName,
  startDynalite,
} from '../../dynamodb/test/helpers';
import type { ListPage, RecordView } from '../src';
import { oncely, silentServer } from './fixture';
import { cliSuite } from './suite';

// dynalite in this process, one table of the test's own.
let dynamo: LocalDynamoDB;
const table = randomTableName();
const prefix = `cli-${randomBytes(4).toString('hex')}:`;
const env = {
  AWS_ACCESS_KEY_ID: CREDENTIALS.accessKeyId,
  AWS_SECRET_ACCESS_KEY: CREDENTIALS.secretAccessKey,
};
const url = () => `dynamodb://${table}?region=${REGION}&endpoint=${encodeURIComponent(dynamo.endpoint)}`;

beforeAll(async () => {
  dynamo = await startDynalite({ returnOldItem: true });
  await new DynamoDBStore({ client: dynamo.client(), tableName: table }).createTable();
});
afterAll(async () => {
  await dynamo?.stop();
});

cliSuite('oncely on DynamoDB', {
  store: () => new DynamoDBStore({ client: dynamo.client(), tableName: table, prefix }),
  connection: () => ['--url', url(), '--prefix', prefix],
  env: () => env,
  writeForeign: async (storeKey) => {
    await dynamo
      .client()
      .send(
        new PutItemCommand({ TableName: table, Item: { pk: { S: prefix + storeKey }, other: { S: 'app' } } }),
      );
  },
});

test('a body split over chunk items: its size is the whole body, and the chunks are no records', async () => {
  const store = new DynamoDBStore({ client: dynamo.client(), tableName: table, prefix: `big-${prefix}` });
  const acquired = await store.acquire('big', { fingerprint: 'f', lockTimeoutMs: 60_000 });
  if (acquired.status !== 'acquired') throw new Error('not acquired');
  const body = Buffer.alloc(900 * 1024, 'x');
  await store.complete('big', acquired.token, { status: 200, headers: {}, body }, 60_000);
  const args = ['--url', url(), '--prefix', `big-${prefix}`];
  const listed = (await oncely(['list', '--json', ...args], env)).json<ListPage>();
  expect(listed.records.map((r) => r.key)).toEqual(['big']);
  expect(listed.records[0]?.response?.bodyBytes).toBe(body.byteLength);
  const inspected = (await oncely(['inspect', 'big', '--json', ...args], env)).json<RecordView>();
  expect(inspected.response?.bodyBytes).toBe(body.byteLength);
  expect(inspected.response?.bodyPreview).toMatch(/^x+$/);
  const stats = await oncely(['stats', '--json', ...args], env);
  expect(stats.json()).toMatchObject({ records: 1, unknown: 0, byState: { completed: 1 } });
  expect(stats.json<{ bytes: number }>().bytes).toBeGreaterThan(body.byteLength);
});

test('a missing table exits 4 naming it, as in SQL', async () => {
  const missing = await oncely(
    ['stats', '--url', url().replace(table, `${table}-missing`), '--timeout', '2000'],
    env,
  );
  expect(missing.code).toBe(4);
  expect(missing.stderr).toContain(`no table ${table}-missing in dynamodb`);
  expect(missing.stderr).toContain('check the table in the URL');
});

test('--table names the table when the URL does not; two different tables are a usage error', async () => {
  const store = new DynamoDBStore({ client: dynamo.client(), tableName: table, prefix });
  expect((await store.acquire('table-option', { fingerprint: 'f', lockTimeoutMs: 60_000 })).status).toBe(
    'acquired',
  );
  const noTable = `dynamodb://?region=${REGION}&endpoint=${encodeURIComponent(dynamo.endpoint)}`;
  const named = await oncely(
    ['stats', '--url', noTable, '--table', table, '--prefix', prefix, '--json'],
    env,
  );
  expect(named.code).toBe(0);
  const same = await oncely(['stats', '--url', url(), '--table', table, '--prefix', prefix, '--json'], env);
  expect(same.code).toBe(0);
  // The same table, counted the same, whichever way it was named.
  const counts = (r: typeof named) => r.json<{ records: number; unknown: number }>();
  expect(counts(named).records).toBeGreaterThan(0);
  expect([counts(named).records, counts(named).unknown]).toEqual([
    counts(same).records,
    counts(same).unknown,
  ]);
  const other = await oncely(['stats', '--url', url(), '--table', `${table}-other`, '--prefix', prefix], env);
  expect(other.code).toBe(2);
  expect(other.stderr).toContain(`--table ${table}-other and the URL's table ${table} differ`);
  const none = await oncely(['stats', '--url', noTable], env);
  expect(none.code).toBe(2);
  expect(none.stderr).toContain('or give --table TABLE');
});

test('an endpoint that never answers exits 3', async () => {
  const silent = await silentServer();
  try {
    const endpoint = `http://127.0.0.1:${silent.port}`;
    const result = await oncely(
      ['stats', '--url', `dynamodb://${table}?region=${REGION}&endpoint=${endpoint}`, '--timeout', '500'],
      env,
    );
    expect(result.code).toBe(3);
    expect(result.stderr).toContain('cannot reach dynamodb');
  } finally {
    silent.close();
  }
});
