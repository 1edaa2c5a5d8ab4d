/**
 * @services postgres
 */
import { idempotency } from '@oncely/express';
import {
  type CommitCut,
  type CommitCutter,
  expectCommitUnknown,
  gatedRoute,
  onceFree,
  startCommitCutter,
} from '@oncely/testing';
import express from 'express';
import pg from 'pg';
import postgres from 'postgres';
import request from 'supertest';
import { PostgresStore } from '../src';
import { connectionString, testSchema } from './helpers';

// A COMMIT whose connection is cut (by a proxy) must not be answered "nothing was kept", on postgres.js as on pg: it
// is a 503 `commit-outcome-unknown`. Cut once the server committed, the retry replays (1 run, 1 row); cut before
// the server saw it, the retry runs the handler again (nothing was kept).
jest.setTimeout(30_000);

const db = testSchema();
let cutter: CommitCutter;
const ends: (() => Promise<unknown>)[] = [];
/** Handler runs per key. */
const runs = new Map<string, number>();

beforeAll(async () => {
  await new PostgresStore({ pool: db.pool(), schema: db.schema }).migrate();
  await db.pool().query(`CREATE TABLE "${db.schema}".charges (key text NOT NULL)`);
  const url = new URL(connectionString);
  cutter = await startCommitCutter('postgres', { host: url.hostname, port: Number(url.port || 5432) });
});
afterAll(async () => {
  for (const end of ends) await end().catch(() => {});
  await cutter?.close();
  await db.drop();
});

type Driver = 'postgres.js' | 'pg';
const insert = `INSERT INTO "${db.schema}".charges (key) VALUES ($1)`;

/** An app whose store and handler reach the server through the cutter, on `driver`. */
function post(driver: Driver): (key: string) => Promise<request.Response> {
  const url = new URL(connectionString);
  url.host = `127.0.0.1:${cutter.port}`;
  let store: PostgresStore<unknown>;
  let write: (tx: unknown, key: string) => Promise<unknown>;
  if (driver === 'pg') {
    const pool = new pg.Pool({ connectionString: url.toString(), max: 4 });
    pool.on('error', () => {}); // the cut client's late error
    ends.push(() => pool.end());
    store = new PostgresStore({ pool, schema: db.schema }) as PostgresStore<unknown>;
    write = (tx, key) => (tx as pg.PoolClient).query(insert, [key]);
  } else {
    const sql = postgres(url.toString(), { max: 4, onnotice: () => {} });
    ends.push(() => sql.end({ timeout: 1 }));
    store = new PostgresStore({ sql, schema: db.schema }) as PostgresStore<unknown>;
    write = (tx, key) => (tx as postgres.TransactionSql).unsafe(insert, [key]);
  }
  const a = express();
  a.use(idempotency({ store, transactional: true }));
  a.post(
    '/charges',
    gatedRoute<express.Request>(runs, new Map(), (req, key) => write(req.idempotency?.db, key)),
  );
  return (key) => request(a).post('/charges').set('Idempotency-Key', key).send();
}

const rows = async (key: string): Promise<number> =>
  Number(
    (await db.pool().query(`SELECT count(*) FROM "${db.schema}".charges WHERE key = $1`, [key])).rows[0]
      .count,
  );

/** Sends `key` with its COMMIT cut as `how`: the answer is a 503 commit-outcome-unknown; then the retry. */
async function cutThenRetry(driver: Driver, key: string, how: CommitCut): Promise<request.Response> {
  const send = post(driver);
  const cut = cutter.cutNextCommit(how);
  const first = await send(key);
  await cut;
  expectCommitUnknown(first);
  return onceFree(() => send(key));
}

describe.each(['postgres.js', 'pg'] as const)('%s', (driver) => {
  test('the connection lost after the server committed: 503 commit-outcome-unknown, and the retry replays', async () => {
    const key = `committed-${driver}`;
    const retry = await cutThenRetry(driver, key, 'answer-lost');
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(runs.get(key)).toBe(1);
    expect(await rows(key)).toBe(1);
  });

  test('a COMMIT lost before the server saw it: 503 commit-outcome-unknown, and the retry runs again', async () => {
    const key = `lost-${driver}`;
    const retry = await cutThenRetry(driver, key, 'commit-lost');
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    expect(runs.get(key)).toBe(2);
    expect(await rows(key)).toBe(1);
  });
});
