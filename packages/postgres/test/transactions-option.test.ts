/**
 * @services postgres
 */
import type { SqlTransactions } from '@oncely/core/adapter';
import type pg from 'pg';
import { PostgresStore } from '../src';
import { testSchema } from './helpers';
import { describeLibraryTransactions } from './library-transactions';

jest.setTimeout(30_000);

const db = testSchema();

/**
 * The smallest library there is: a pg client in BEGIN ... COMMIT. It decodes nothing (every column as the server's
 * text: bigint as a string, boolean as 't', bytea as '\x...', jsonb as its text), the way the least helpful
 * library would, so the store's own reading of rows is what is tested.
 */
function rawTextTransactions(pool: pg.Pool): SqlTransactions<pg.PoolClient> {
  return {
    dialect: 'postgres',
    async run(work) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        await work(client);
        await client.query('COMMIT');
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {});
        throw error;
      } finally {
        client.release();
      }
    },
    async query(tx, text, params) {
      const result = await tx.query({
        text,
        values: params as unknown[],
        types: { getTypeParser: () => (value: string) => value },
      });
      return { rows: result.rows, rowCount: result.rowCount ?? 0 };
    },
  };
}

let store: PostgresStore<pg.PoolClient>;

beforeAll(async () => {
  store = new PostgresStore({
    pool: db.pool(),
    schema: db.schema,
    transactions: rawTextTransactions(db.pool()),
  });
  await store.migrate();
  await db.pool().query(`CREATE TABLE "${db.schema}".charges (id serial PRIMARY KEY, key text NOT NULL)`);
  // A constraint checked only at COMMIT: lets a test make the commit itself fail.
  await db
    .pool()
    .query(
      `CREATE TABLE "${db.schema}".deferred (v int, CONSTRAINT once UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`,
    );
  await db.pool().query(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
});
afterAll(() => db.drop());

describeLibraryTransactions('a SqlTransactions of the application', {
  store: () => store,
  insert: async (tx, key) => {
    await tx.query(`INSERT INTO "${db.schema}".charges (key) VALUES ($1)`, [key]);
  },
  count: async (key) =>
    Number(
      (await db.pool().query(`SELECT count(*) FROM "${db.schema}".charges WHERE key = $1`, [key])).rows[0]
        .count,
    ),
  breakCommit: async (tx) => {
    await tx.query(`INSERT INTO "${db.schema}".deferred VALUES (1)`);
  },
  recordState: async (key) =>
    (await db.pool().query(`SELECT state FROM "${db.schema}".oncely_idempotency WHERE key = $1`, [key]))
      .rows[0]?.state as string | undefined,
});

test('a SqlTransactions for another database, or not one at all, is refused at construction', () => {
  const mysql = { ...rawTextTransactions(db.pool()), dialect: 'mysql' as const };
  expect(() => new PostgresStore({ pool: db.pool(), transactions: mysql })).toThrow(/'postgres'/);
  expect(
    () =>
      new PostgresStore({
        pool: db.pool(),
        transactions: { dialect: 'postgres' } as unknown as SqlTransactions<unknown>,
      }),
  ).toThrow(/transactions/);
});
