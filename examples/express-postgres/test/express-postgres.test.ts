/**
 * @services postgres
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { type CommandProcess, runRootScript } from '@oncely/testing';
import pg from 'pg';

// The example as a user runs it (`npm run example:express-postgres` at the root), in a schema of this file's own;
// the orders are counted in the database itself.
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = `oncely_example_${randomBytes(6).toString('hex')}`;
const pool = new pg.Pool({ connectionString: databaseUrl });
let app: CommandProcess;
let url: string;

beforeAll(async () => {
  app = runRootScript('example:express-postgres', [], {
    PORT: '0',
    SCHEMA: schema,
    DATABASE_URL: databaseUrl,
  });
  url = (await app.waitForLine(/listening on (http:\/\/\S+)/))[1] as string;
}, 60_000);

afterAll(async () => {
  await app?.kill();
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

const order = (
  key: string,
  body: object = { item: 'book', quantity: 1 },
  headers: Record<string, string> = {},
) =>
  fetch(`${url}/orders`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });

const ordersFor = async (key: string) =>
  Number(
    (await pool.query(`SELECT count(*) FROM "${schema}".orders WHERE idempotency_key = $1`, [key])).rows[0]
      .count,
  );
const recordOf = async (key: string) =>
  (await pool.query(`SELECT state FROM "${schema}".oncely_idempotency WHERE key LIKE '%' || $1`, [key]))
    .rows[0] as { state: string } | undefined;

test('the same order twice: 201, then the stored 201 replayed; one row in orders', async () => {
  const key = `order-${randomUUID()}`;
  const first = await order(key);
  const firstBody = await first.text();
  expect(first.status).toBe(201);
  const again = await order(key);
  expect(again.status).toBe(201);
  expect(again.headers.get('idempotent-replayed')).toBe('true');
  expect(await again.text()).toBe(firstBody);
  expect(await ordersFor(key)).toBe(1);
});

test('20 simultaneous requests with one key: one row in orders', async () => {
  const key = `order-${randomUUID()}`;
  const answers = await Promise.all(Array.from({ length: 20 }, () => order(key)));
  expect(answers.every((answer) => answer.status === 201 || answer.status === 409)).toBe(true);
  expect(answers.some((answer) => answer.status === 201)).toBe(true);
  expect(await ordersFor(key)).toBe(1);
});

test('a handler that fails after its insert leaves no order and frees the key; the retry creates one order', async () => {
  const key = `order-${randomUUID()}`;
  const failed = await order(key, { item: 'lamp', quantity: 2 }, { 'x-fail-after-insert': '1' });
  expect(failed.status).toBe(500);
  // The insert happened inside the transaction and was rolled back with the record.
  expect(await ordersFor(key)).toBe(0);
  expect(await recordOf(key)).toBeUndefined();

  const retry = await order(key, { item: 'lamp', quantity: 2 });
  expect(retry.status).toBe(201);
  expect(retry.headers.get('idempotent-replayed')).toBeNull();
  expect(await ordersFor(key)).toBe(1);
  expect((await recordOf(key))?.state).toBe('completed');
});

test('the same key with another body: 422, and still one order', async () => {
  const key = `order-${randomUUID()}`;
  expect((await order(key)).status).toBe(201);
  const other = await order(key, { item: 'book', quantity: 50 });
  expect(other.status).toBe(422);
  expect(other.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  expect(await ordersFor(key)).toBe(1);
});

test('GET /orders lists what the database holds', async () => {
  const listed = (await (await fetch(`${url}/orders`)).json()) as { count: number };
  const counted = Number((await pool.query(`SELECT count(*) FROM "${schema}".orders`)).rows[0].count);
  expect(listed.count).toBe(counted);
  expect(counted).toBeGreaterThanOrEqual(4);
});
