/**
 * @services mariadb
 */
import { join } from 'node:path';
import { type AppProcess, fireAtOnce, startAppProcess } from '@oncely/testing';
import request from 'supertest';
import { MySQLStore } from '../src';
import { mysqlUrl, testTables } from './helpers';

// Transactional mode across processes: app processes on one table, a crash mid-transaction, and many concurrent
// requests for the same keys. Each execution inserts a row into `charges` inside its transaction.
jest.setTimeout(60_000);

const db = testTables();
const records = db.table('txp');
const charges = db.table('txp_charges');
const script = join(__dirname, 'fixtures', 'transactional-app.ts');
const env = { MYSQL_URL: mysqlUrl, TABLE: records, CHARGES: charges };
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
// Started together (each start takes seconds): one to be killed mid-transaction, two that serve the rest.
let doomed: AppProcess;
let apps: AppProcess[];

beforeAll(async () => {
  await new MySQLStore({ pool: db.pool(), table: records }).migrate();
  [doomed, ...apps] = await Promise.all([
    startAppProcess(script, { ...env, HANG: '1' }),
    startAppProcess(script, env),
    startAppProcess(script, env),
  ]);
  await db
    .pool()
    .query(
      `CREATE TABLE \`${charges}\` (id INT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(200) NOT NULL, pid INT, KEY (\`key\`))`,
    );
});
afterAll(async () => {
  await Promise.all([doomed, ...apps].map((app) => app?.kill()));
  await db.drop();
});

const count = async (key: string) => {
  const [rows] = await db.pool().query(`SELECT count(*) AS n FROM \`${charges}\` WHERE \`key\` = ?`, [key]);
  return Number((rows as { n: number }[])[0]?.n);
};

test('a process SIGKILLed between its write and the commit leaves no row nor record; the retry runs once', async () => {
  const key = 'killed';
  const survivor = apps[0] as AppProcess;
  const pending = request(doomed.url)
    .post('/charges')
    .set('Idempotency-Key', key)
    .send({})
    .then(
      () => 'answered',
      () => 'connection lost',
    );
  await doomed.waitForLine((line) => line === `inserted ${key}`);
  await doomed.kill();
  expect(await pending).toBe('connection lost');
  // The server rolls back the session whose connection died: neither the business row nor the record is left.
  expect(await count(key)).toBe(0);
  expect(await new MySQLStore({ pool: db.pool(), table: records }).get(key)).toBeUndefined();

  // Until the server has noticed the dead connection, its named lock still says "in progress".
  let retry = await request(survivor.url).post('/charges').set('Idempotency-Key', key).send({});
  for (let i = 0; i < 50 && retry.status === 409; i++) {
    await sleep(100);
    retry = await request(survivor.url).post('/charges').set('Idempotency-Key', key).send({});
  }
  expect(retry.status).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBeUndefined();
  const again = await request(survivor.url).post('/charges').set('Idempotency-Key', key).send({});
  expect(again.headers['idempotent-replayed']).toBe('true');
  expect(await count(key)).toBe(1);
});

test('1,000 concurrent requests over 200 keys, two processes: one business row per key, no 5xx', async () => {
  // Each key five times in a row: its requests go out together, to both processes.
  const keys = Array.from({ length: 1000 }, (_, i) => `load-${Math.floor(i / 5)}`);
  const results = await fireAtOnce({ urls: apps.map((a) => a.url), path: '/charges', keys, total: 1000 });

  const statuses: Record<string, number> = {};
  for (const r of results) {
    const kind = r.status === 201 ? (r.replayed ? '201 replayed' : '201') : String(r.status);
    statuses[kind] = (statuses[kind] ?? 0) + 1;
  }
  console.log('1,000 requests over 200 keys:', JSON.stringify(statuses));
  expect(Object.keys(statuses).filter((s) => s.startsWith('5'))).toEqual([]);
  expect(Object.keys(statuses).every((s) => ['201', '201 replayed', '409'].includes(s))).toBe(true);
  const [rows] = await db
    .pool()
    .query(`SELECT \`key\`, count(*) AS n FROM \`${charges}\` WHERE \`key\` LIKE 'load-%' GROUP BY \`key\``);
  const perKey = rows as { key: string; n: number }[];
  // Exactly one row per key that some request executed, and each executed request is the only one for its key.
  expect(perKey.filter((r) => Number(r.n) !== 1)).toEqual([]);
  expect(perKey.length).toBe(statuses['201'] ?? 0);
  // Every key ran: a key answered only 409 would be one whose holder never committed.
  expect(perKey.length).toBe(200);
});
