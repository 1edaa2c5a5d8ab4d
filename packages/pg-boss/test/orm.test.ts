/**
 * @services postgres
 */
import { randomUUID } from 'node:crypto';
import { kyselyTransactions } from '@oncely/orm/kysely';
import { idempotentWorker } from '@oncely/pg-boss';
import { PostgresStore } from '@oncely/postgres';
import { type Generated, Kysely, PostgresDialect, type Transaction } from 'kysely';
import type PgBoss from 'pg-boss';
import { settledJob, testDatabase } from './helpers';

// Transactional workers through an ORM: fn gets the ORM's own transaction (Kysely here), and the job's writes
// through it commit with the key's record.
jest.setTimeout(60_000);

interface Database {
  shipments: { id: Generated<number>; key: string; n: number };
}

const db = testDatabase();
let boss: PgBoss;
let kysely: Kysely<Database>;
let store: PostgresStore<Transaction<Database>>;

beforeAll(async () => {
  boss = await db.boss();
  kysely = new Kysely<Database>({ dialect: new PostgresDialect({ pool: db.pool() }) });
  store = new PostgresStore({ pool: db.pool(), schema: db.schema, transactions: kyselyTransactions(kysely) });
  await store.migrate();
  await db
    .pool()
    .query(
      `CREATE TABLE "${db.schema}".shipments (id serial PRIMARY KEY, key text NOT NULL, n int NOT NULL)`,
    );
});
afterAll(() => db.drop());

type Data = { idempotencyKey?: string; n: number };
type Job = PgBoss.Job<Data>;

async function queue(): Promise<string> {
  const name = `q-${randomUUID()}`;
  await boss.createQueue(name, { name, retryLimit: 2, retryDelay: 0, expireInSeconds: 30 });
  return name;
}
const send = async (name: string, data: Data): Promise<string> => (await boss.send(name, data)) as string;
const rows = async (key: string): Promise<number> =>
  (await db.pool().query(`SELECT count(*)::int AS n FROM "${db.schema}".shipments WHERE key = $1`, [key]))
    .rows[0].n;

test('fn writes through the Kysely transaction: a duplicate job replays; a throw rolls the write back and the retry commits once', async () => {
  const name = await queue();
  let attempts = 0;
  let rowsSeenByRetry = -1;
  await boss.work<Data>(
    name,
    idempotentWorker(
      async (job: Job, { key, db: tx }) => {
        attempts++;
        if (attempts === 2) rowsSeenByRetry = await rows(key);
        const { id } = await tx
          .withSchema(db.schema)
          .insertInto('shipments')
          .values({ key, n: job.data.n })
          .returning('id')
          .executeTakeFirstOrThrow();
        if (attempts === 1) throw new Error('failed after writing');
        return { shipment: id };
      },
      { boss, store, transactional: true },
    ),
  );
  const first = await settledJob(boss, name, await send(name, { idempotencyKey: 'orm-1', n: 1 }));
  const second = await settledJob(boss, name, await send(name, { idempotencyKey: 'orm-1', n: 1 }));
  expect([first.state, first.retryCount]).toEqual(['completed', 1]);
  expect(rowsSeenByRetry).toBe(0);
  expect(second.state).toBe('completed');
  expect(second.output).toEqual(first.output);
  expect(attempts).toBe(2);
  expect(await rows('orm-1')).toBe(1);
  expect((await store.get('orm-1'))?.state).toBe('completed');
  await boss.offWork(name);
});
