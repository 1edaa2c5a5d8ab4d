/**
 * @services postgres
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { type CommandProcess, runRootScript } from '@oncely/testing';
import pg from 'pg';

// The Drizzle example as a user runs it (`npm run example:express-drizzle` at the root), in a schema of its own.
// The shared ORM suite proves the integration; this proves the example wires it: the order goes through Drizzle's
// transaction (written through `db` instead, the failed request would leave its order behind).
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = `oncely_example_drizzle_${randomBytes(6).toString('hex')}`;
const pool = new pg.Pool({ connectionString: databaseUrl });
let app: CommandProcess;
let url: string;

beforeAll(async () => {
  app = runRootScript('example:express-drizzle', [], {
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

async function send(key: string, failAfterInsert = false): Promise<Response> {
  return fetch(`${url}/orders`, {
    method: 'POST',
    headers: {
      'idempotency-key': key,
      'content-type': 'application/json',
      ...(failAfterInsert ? { 'x-fail-after-insert': '1' } : {}),
    },
    body: JSON.stringify({ item: 'lamp', quantity: 2 }),
  });
}

async function rows(key: string): Promise<{ orders: number; records: string[] }> {
  const orders = await pool.query(`SELECT 1 FROM "${schema}".orders WHERE idempotency_key = $1`, [key]);
  const records = await pool.query<{ state: string }>(
    `SELECT state FROM "${schema}".oncely_idempotency WHERE key LIKE '%' || $1`,
    [key],
  );
  return { orders: orders.rowCount ?? 0, records: records.rows.map((row) => row.state) };
}

test('a failure after the Drizzle insert keeps nothing; the retry creates one order, then replays it', async () => {
  const key = `order-${randomUUID()}`;
  expect((await send(key, true)).status).toBe(500);
  expect(await rows(key)).toEqual({ orders: 0, records: [] });

  const created = await send(key);
  expect(created.status).toBe(201);
  const body = await created.text();
  expect(await rows(key)).toEqual({ orders: 1, records: ['completed'] });

  const replayed = await send(key);
  expect(replayed.headers.get('idempotent-replayed')).toBe('true');
  expect(await replayed.text()).toBe(body);
  expect(await rows(key)).toEqual({ orders: 1, records: ['completed'] });
});

test('20 simultaneous requests with one key: one order, and GET /orders lists it', async () => {
  const key = `order-${randomUUID()}`;
  const answers = await Promise.all(Array.from({ length: 20 }, () => send(key)));
  expect(answers.every((answer) => answer.status === 201 || answer.status === 409)).toBe(true);
  expect((await rows(key)).orders).toBe(1);
  const listed = (await (await fetch(`${url}/orders`)).json()) as { orders: { idempotencyKey: string }[] };
  expect(listed.orders.filter((order) => order.idempotencyKey === key)).toHaveLength(1);
});
