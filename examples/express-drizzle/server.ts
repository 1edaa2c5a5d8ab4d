// Express 5 and Drizzle on PostgresStore in transactional mode: the handler inserts the order with Drizzle, on the
// transaction oncely opened for the request, so the order and its idempotency record commit together or not at
// all. Run from the repository root:
//   npm run example:express-drizzle
import { randomUUID } from 'node:crypto';
import { idempotency } from '@oncely/express';
import { drizzleTransactions } from '@oncely/orm/drizzle';
import { PostgresStore } from '@oncely/postgres';
import { asc } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { bigserial, integer, pgSchema, pgTable, text, timestamp } from 'drizzle-orm/pg-core';
import express from 'express';
import pg from 'pg';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const port = Number(process.env.PORT ?? 3003);
const schema = process.env.SCHEMA ?? 'public';
if (!/^[a-z_][a-z0-9_]*$/.test(schema)) {
  console.error(`SCHEMA must be a lower-case SQL identifier; got ${JSON.stringify(schema)}`);
  process.exit(1);
}

const columns = {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  idempotencyKey: text('idempotency_key'),
  item: text('item').notNull(),
  quantity: integer('quantity').notNull(),
  createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
};
// Drizzle names the public schema by leaving it out.
const orders = schema === 'public' ? pgTable('orders', columns) : pgSchema(schema).table('orders', columns);

// One pool for Drizzle and the store: each request in flight holds one connection until its commit.
const pool = new pg.Pool({ connectionString: databaseUrl, max: 20, connectionTimeoutMillis: 5000 });
pool.on('error', (error) => console.error(`postgres: ${error.message}`));
const db = drizzle({ client: pool, schema: { orders } });
const transactions = drizzleTransactions(db);
const store = new PostgresStore({ pool, schema, transactions });
try {
  await pool.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
  await store.migrate();
  await pool.query(`CREATE TABLE IF NOT EXISTS "${schema}".orders (
    id bigserial PRIMARY KEY,
    idempotency_key text,
    item text NOT NULL,
    quantity integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
  )`);
} catch (error) {
  console.error(
    `PostgreSQL is not reachable at ${databaseUrl} (${(error as Error).message}). ` +
      'Start it: bash scripts/services.sh, or docker compose up -d postgres; or point DATABASE_URL at yours.',
  );
  await pool.end();
  process.exit(1);
}

const app = express();
app.use(express.json()); // before idempotency(): the body is part of the request's fingerprint

app.post('/orders', idempotency({ store, transactional: true, required: true }), async (req, res) => {
  const { item, quantity } = req.body as { item?: unknown; quantity?: unknown };
  if (typeof item !== 'string' || typeof quantity !== 'number' || !Number.isInteger(quantity)) {
    res.status(400).json({ error: 'send {"item": string, "quantity": integer}' });
    return;
  }
  // Drizzle's transaction for this request: the insert commits with the idempotency record, or not at all.
  const tx = transactions.transactionOf(req);
  const [order] = await tx
    .insert(orders)
    .values({ idempotencyKey: req.idempotencyKey, item, quantity })
    .returning({ id: orders.id, createdAt: orders.createdAt });
  if (order === undefined) throw new Error('the insert returned no row');
  // A fault after the insert, for trying what a crash in the middle of the handler does. The header is not part of
  // the fingerprint, so the same request without it is a retry of this one.
  if (req.get('x-fail-after-insert') === '1') {
    throw new Error(`order ${order.id}: failing after the insert, as asked (X-Fail-After-Insert)`);
  }
  console.log(`order ${order.id} created (key ${req.idempotencyKey})`);
  res.status(201).json({ id: order.id, item, quantity, created: order.createdAt });
});

app.get('/orders', async (_req, res) => {
  const rows = await db.select().from(orders).orderBy(asc(orders.id));
  res.json({ count: rows.length, orders: rows });
});

// Express 5 passes a rejected handler's error here; oncely has already rolled the transaction back by then.
app.use((error: Error, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
  console.error(error.message);
  res
    .status(500)
    .json({ error: 'internal error; the order was not created, and a retry with the same key runs again' });
});

const server = app.listen(port, '127.0.0.1');
server.on('error', (error: NodeJS.ErrnoException) => {
  console.error(`Could not listen on port ${port}: ${error.message}. Try PORT=3013.`);
  process.exit(1);
});
server.on('listening', () => {
  const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  const key = `order-${randomUUID()}`;
  const post = (extra = '') =>
    `curl -i -X POST ${url}/orders -H 'Idempotency-Key: ${key}' -H 'Content-Type: application/json'${extra} -d '{"item":"book","quantity":1}'`;
  console.log(`oncely example listening on ${url} (Express 5, Drizzle on PostgresStore, transactional, schema ${schema}). Ctrl+C to stop.

1. A request that fails after its insert: 500, and the insert is rolled back with the record, so no order exists
   and the key is free again.

   ${post(" -H 'X-Fail-After-Insert: 1'")}

2. The retry: 201 and one order. Send it twice: the second answer is the stored 201 with "Idempotent-Replayed: true",
   and this terminal prints one "order ... created" line.

   ${post()}

3. The orders: one for that key.

   curl ${url}/orders
`);
});

const stop = () => {
  server.close(() => void pool.end().then(() => process.exit(0)));
  server.closeAllConnections();
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
