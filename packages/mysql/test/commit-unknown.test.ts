/**
 * @services mariadb
 */
import { idempotency } from '@oncely/express';
import {
  type CommitCutter,
  expectCommitUnknown,
  gatedRoute,
  onceFree,
  startCommitCutter,
} from '@oncely/testing';
import express from 'express';
import mysql from 'mysql2/promise';
import request from 'supertest';
import { MySQLStore, transactionConnection, withQueryTimeout } from '../src';
import { mysqlUrl, testTables } from './helpers';

// A COMMIT whose answer never reaches the client (the connection cut by a proxy once the server committed, or the
// answer withheld until withQueryTimeout gives up) must not be answered "nothing was kept": it is a 503
// `commit-outcome-unknown`, and the retry replays what committed. A COMMIT lost before the server saw it is the
// same 503, and the retry runs the handler again (nothing was kept).
jest.setTimeout(30_000);

const QUERY_TIMEOUT = 1000;

const db = testTables();
const records = db.table('cu');
const charges = db.table('cu_charges');
let cutter: CommitCutter;
const pools: mysql.Pool[] = [];
/** Handler runs per key. */
const runs = new Map<string, number>();

beforeAll(async () => {
  await new MySQLStore({ pool: db.pool(), table: records }).migrate();
  await db.pool().query(`CREATE TABLE \`${charges}\` (\`key\` VARCHAR(200) NOT NULL)`);
  const url = new URL(mysqlUrl);
  cutter = await startCommitCutter('mysql', { host: url.hostname, port: Number(url.port || 3306) });
});
afterAll(async () => {
  for (const pool of pools) await pool.end().catch(() => {});
  await cutter?.close();
  await db.drop();
});

/** An app whose store and handler reach the server through the cutter; `timed`: with withQueryTimeout. */
function post(timed: boolean): (key: string) => Promise<request.Response> {
  const url = new URL(mysqlUrl);
  url.host = `127.0.0.1:${cutter.port}`;
  const raw = mysql.createPool({ uri: url.toString(), connectionLimit: 4 });
  raw.on('connection', (connection) => connection.on('error', () => {})); // the cut connection's late error
  pools.push(raw);
  const pool = timed ? withQueryTimeout(raw, QUERY_TIMEOUT) : raw;
  const a = express();
  a.use(idempotency({ store: new MySQLStore({ pool, table: records }), transactional: true }));
  a.post(
    '/charges',
    gatedRoute<express.Request>(runs, new Map(), (req, key) =>
      transactionConnection(req).query(`INSERT INTO \`${charges}\` (\`key\`) VALUES (?)`, [key]),
    ),
  );
  return (key) => request(a).post('/charges').set('Idempotency-Key', key).send();
}

const rows = async (key: string): Promise<number> => {
  const [found] = await db.pool().query(`SELECT count(*) AS n FROM \`${charges}\` WHERE \`key\` = ?`, [key]);
  return Number((found as { n: number }[])[0]?.n);
};

test.each([
  ['the connection lost after the server committed', 'answer-lost', false],
  ['no answer within withQueryTimeout', 'answer-withheld', true],
] as const)('%s: 503 commit-outcome-unknown, and the retry replays (1 run, 1 row)', async (_, how, timed) => {
  const send = post(timed);
  const key = `committed-${how}`;
  const cut = cutter.cutNextCommit(how);
  const first = await send(key);
  await cut;
  expectCommitUnknown(first);
  expect(await rows(key)).toBe(1);
  const retry = await onceFree(() => send(key));
  expect(retry.status).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(runs.get(key)).toBe(1);
  expect(await rows(key)).toBe(1);
});

test('a COMMIT lost before the server saw it: 503 commit-outcome-unknown, and the retry runs again (nothing was kept)', async () => {
  const send = post(false);
  const cut = cutter.cutNextCommit('commit-lost');
  const first = await send('lost');
  await cut;
  expectCommitUnknown(first);
  const retry = await onceFree(() => send('lost'));
  expect(retry.status).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBeUndefined();
  expect(runs.get('lost')).toBe(2);
  expect(await rows('lost')).toBe(1);
});
