/**
 * @services postgres
 */
import { type SqlTransactions, transactionOfRequest } from '@oncely/core/adapter';
import { transactionalSuite } from '@oncely/testing';
import type pg from 'pg';
import { PostgresStore } from '../src';
import { pgSuiteParts, testSchema } from './helpers';

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

transactionalSuite<pg.PoolClient>({
  name: 'PostgresStore on a SqlTransactions of the application',
  commitFailure: 'a deferred constraint',
  target: () => ({
    store,
    // What an application's accessor does: the request's transaction, as its library's type.
    transactionOf: (req) => transactionOfRequest<pg.PoolClient>(req, 'test'),
    ...pgSuiteParts(db),
  }),
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
