/**
 * @services mariadb
 */
import { type TransactionalSuiteTarget, transactionalSuite, transactionalSuiteApp } from '@oncely/testing';
import type { Pool, PoolConnection } from 'mysql2/promise';
import request from 'supertest';
import { MySQLStore, transactionConnection } from '../src';
import { testTables } from './helpers';

jest.setTimeout(30_000);

const db = testTables();
const records = db.table('tx');
const charges = db.table('tx_charges');
let store: MySQLStore;

beforeAll(async () => {
  store = new MySQLStore({ pool: db.pool(), table: records });
  await store.migrate();
  await db
    .pool()
    .query(
      `CREATE TABLE \`${charges}\` (id INT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(200) NOT NULL, KEY (\`key\`))`,
    );
});
afterAll(() => db.drop());

const insertCharge = `INSERT INTO \`${charges}\` (\`key\`) VALUES (?)`;

/** No connection checked out once the requests are answered: a leaked one would hold its named lock. */
function expectPoolIdle(pool: Pool = db.pool()): void {
  const core = (pool as unknown as { pool: { _allConnections: unknown[]; _freeConnections: unknown[] } })
    .pool;
  expect(core._freeConnections.length).toBe(core._allConnections.length);
}

const target: TransactionalSuiteTarget<PoolConnection> = {
  get store() {
    return store;
  },
  transactionOf: (req) => transactionConnection(req),
  charge: (connection, key) => connection.query(insertCharge, [key]),
  chargeOutside: (key) => db.pool().query(insertCharge, [key]),
  count: async (key) => {
    const [rows] = await db.pool().query(`SELECT count(*) AS n FROM \`${charges}\` WHERE \`key\` = ?`, [key]);
    return Number((rows as { n: number }[])[0]?.n);
  },
  recordState: async (key) => {
    const [rows] = await db.pool().query(`SELECT state FROM \`${records}\` WHERE \`key\` = ?`, [key]);
    return (rows as { state: string }[])[0]?.state;
  },
  breakCommit: async (connection) => {
    // Another session ends this one before the commit: the server rolls the transaction back, and the pool discards
    // the killed connection, its named lock going with it (the suite's retry would otherwise get 409).
    const [rows] = await connection.query('SELECT CONNECTION_ID() AS id');
    await db.pool().query('KILL CONNECTION ?', [(rows as { id: number }[])[0]?.id]);
  },
  expectIdle: () => expectPoolIdle(),
};

transactionalSuite({ name: 'MySQLStore', commitFailure: 'its connection killed', target: () => target });

describe('transactional mode over HTTP: MySQL locks', () => {
  test('a row held by a session without the named lock: the lock wait times out into a 409, not a 5xx', async () => {
    // Another session (a plain-mode acquire, a migration script) holds the key's row in an open transaction.
    const other = await db.pool().getConnection();
    const impatient = testTables();
    impatient.pool().on('connection', (connection) => {
      connection.query('SET SESSION innodb_lock_wait_timeout = 1');
    });
    try {
      await other.query('START TRANSACTION');
      await other.query(
        `INSERT INTO \`${records}\` (\`key\`, fingerprint, state, token, lock_expires_at, expires_at, created_at)
         VALUES ('row-held', '', 'in_progress', 'outsider', 0, 0, 0)`,
      );
      const { app } = transactionalSuiteApp(target, {
        store: new MySQLStore({ pool: impatient.pool(), table: records }),
      });
      const res = await request(app).post('/charges').set('Idempotency-Key', 'row-held').send({ amount: 1 });
      expect(res.status).toBe(409);
      expect(await target.count('row-held')).toBe(0);
      expectPoolIdle(impatient.pool());
    } finally {
      await other.query('ROLLBACK');
      other.release();
      await impatient.drop();
    }
  });

  test('a deadlock in the acquire starts over in a new transaction, not in autocommit', async () => {
    // InnoDB rolls back a deadlock victim's whole transaction: the acquire that was chosen runs again in a new one.
    // Were it rerun on the same session, the record and the handler's row would autocommit, and survive its failure.
    const pool = db.pool();
    const getConnection = pool.getConnection.bind(pool);
    let deadlocks = 0;
    const faulty = Object.create(pool) as Pool;
    faulty.getConnection = async () => {
      const connection = await getConnection();
      const proxy = Object.create(connection) as PoolConnection;
      proxy.execute = (async (statement: string, params: unknown[]) => {
        if (deadlocks === 0 && statement.startsWith('INSERT INTO')) {
          deadlocks++;
          await connection.query('ROLLBACK');
          throw Object.assign(new Error('Deadlock found when trying to get lock'), {
            errno: 1213,
            code: 'ER_LOCK_DEADLOCK',
          });
        }
        return connection.execute(statement, params as never);
      }) as PoolConnection['execute'];
      return proxy;
    };
    const { app } = transactionalSuiteApp(target, {
      store: new MySQLStore({ pool: faulty, table: records }),
    });
    await request(app)
      .post('/charges')
      .set('Idempotency-Key', 'deadlocked')
      .send({ amount: 1, fail: true })
      .expect(500);
    expect(deadlocks).toBe(1);
    expect(await target.count('deadlocked')).toBe(0);
    expect(await target.recordState('deadlocked')).toBeUndefined();
    expectPoolIdle();
  });
});
