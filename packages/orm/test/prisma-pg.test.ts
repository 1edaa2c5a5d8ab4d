/**
 * @services postgres
 */
import { join } from 'node:path';
import { type OrmSuiteTarget, ormSuite, ormSuiteApp, ormSuiteId } from '@oncely/testing';
import { PrismaPg } from '@prisma/adapter-pg';
import request from 'supertest';
import { prismaTransactions } from '../src/prisma/index';
import { type Prisma, PrismaClient } from './prisma/generated/postgres/client';

jest.setTimeout(30_000);

ormSuite(join(__dirname, 'targets', 'prisma-pg.ts'));

describe('Prisma’s interactive transaction options: maxWait and timeout', () => {
  let target: OrmSuiteTarget<Prisma.TransactionClient>;
  beforeAll(async () => {
    const { createTarget } = await import('./targets/prisma-pg');
    target = await createTarget({ id: ormSuiteId() }, { timeout: 1000 });
    await target.setup();
  });
  afterAll(async () => {
    await target.drop();
    await target.close();
  });

  test('a request that waits longer than maxWait for a connection fails before its handler runs', async () => {
    const { createTarget } = await import('./targets/prisma-pg');
    // One connection: the first request holds it for its whole handler.
    const small = await createTarget({ id: ormSuiteId() }, { maxWait: 200, timeout: 10_000 }, 1);
    try {
      await small.setup();
      const { app, runs } = ormSuiteApp(small as OrmSuiteTarget<unknown>);
      const [held, waiting] = [`${ormSuiteId()}-held`, `${ormSuiteId()}-waiting`];
      const first = request(app).post('/orders').set('Idempotency-Key', held).send({ holdMs: 1500 });
      const started = first.then((r) => r);
      await new Promise((resolve) => setTimeout(resolve, 500));
      const second = await request(app).post('/orders').set('Idempotency-Key', waiting).send({});
      expect(second.status).toBe(503);
      expect(runs.get(waiting)).toBeUndefined();
      expect(await small.store.get(waiting)).toBeUndefined();
      expect((await started).status).toBe(201);
      expect((await request(app).post('/orders').set('Idempotency-Key', waiting).send({})).status).toBe(201);
    } finally {
      await small.drop();
      await small.close();
    }
  });

  test('a handler outlasting it fails, and a retry meanwhile runs beside it: the key was freed by the rollback', async () => {
    const { app, runs } = ormSuiteApp(target as OrmSuiteTarget<unknown>);
    const key = `${ormSuiteId()}-slow`;
    const slow = request(app).post('/orders').set('Idempotency-Key', key).send({ holdMs: 3000 });
    const answered = slow.then((r) => r);
    // Past the 1 s timeout, while the slow handler still holds: Prisma has rolled back and the key is free.
    await new Promise((resolve) => setTimeout(resolve, 1800));
    const retry = await request(app).post('/orders').set('Idempotency-Key', key).send({});
    expect(retry.status).toBe(201);
    expect(runs.get(key)).toBe(2);
    // The handler's answer came too late: its commit was refused, and its insert is gone.
    const late = await answered;
    expect(late.status).toBe(500);
    expect(late.body.type).toMatch(/transaction-failed$/);
    expect(await target.countOrders(key)).toBe(1);
    expect((await target.store.get(key))?.state).toBe('completed');
  });
});

describe('statements on the transaction client', () => {
  const table = `oncely_prisma_${ormSuiteId()}`;
  const prisma = new PrismaClient({
    adapter: new PrismaPg({
      connectionString: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    }),
  });
  const transactions = prismaTransactions(prisma);
  afterAll(async () => {
    await prisma.$executeRawUnsafe(`DROP TABLE IF EXISTS ${table}, ${table}_log`);
    await prisma.$disconnect();
  });

  test('rows for a SELECT or RETURNING, affected rows otherwise, a CTE counted by its own verb', async () => {
    expect(transactions.dialect).toBe('postgres');
    await prisma.$executeRawUnsafe(`CREATE TABLE ${table} (key text PRIMARY KEY, n int, body bytea)`);
    await prisma.$executeRawUnsafe(`CREATE TABLE ${table}_log (key text)`);
    let seen: unknown;
    await transactions.run(async (tx) => {
      const q = (statement: string, params: unknown[] = []) => transactions.query(tx, statement, params);
      expect(
        await q(`INSERT INTO ${table} VALUES ($1, 1, $2), ($3, 1, $2)`, ['a', Buffer.from('x'), 'b']),
      ).toEqual({
        rows: [],
        rowCount: 2,
      });
      expect(await q(`UPDATE ${table} SET n = n + 1 WHERE n = $1`, [1])).toEqual({ rows: [], rowCount: 2 });
      // Its own verb is INSERT: the count is of the log rows, though it starts WITH and holds a RETURNING.
      const logged = await q(
        `WITH done AS (UPDATE ${table} SET n = 3 WHERE key = $1 RETURNING key) INSERT INTO ${table}_log (key) SELECT key FROM done`,
        ['a'],
      );
      expect(logged).toEqual({ rows: [], rowCount: 1 });
      const selected = await q(`SELECT key, body FROM ${table} WHERE key = $1 OR $1 = 'none' ORDER BY key`, [
        'b',
      ]);
      expect(selected.rowCount).toBe(1);
      expect(selected.rows[0]?.key).toBe('b');
      expect(Buffer.from(selected.rows[0]?.body as Uint8Array).toString()).toBe('x');
      const deleted = await q(`DELETE FROM ${table} WHERE key = $1 RETURNING n`, ['a']);
      expect(deleted).toEqual({ rows: [{ n: 3 }], rowCount: 1 });
      seen = tx;
    });
    expect(seen).toBeDefined();
    expect(await prisma.$queryRawUnsafe(`SELECT key FROM ${table}_log`)).toEqual([{ key: 'a' }]);
  });

  test('run rolls back when its work rejects, and rejects with the work’s error', async () => {
    const failure = new Error('work failed');
    await expect(
      transactions.run(async (tx) => {
        await transactions.query(tx, `INSERT INTO ${table}_log (key) VALUES ($1)`, ['rolled-back']);
        throw failure;
      }),
    ).rejects.toBe(failure);
    expect(await prisma.$queryRawUnsafe(`SELECT key FROM ${table}_log WHERE key = 'rolled-back'`)).toEqual(
      [],
    );
  });

  test('a nested tx.$transaction is a savepoint inside it: its failure undoes only its own writes', async () => {
    await transactions.run(async (tx) => {
      await tx.$executeRawUnsafe(`INSERT INTO ${table}_log (key) VALUES ('outer')`);
      await expect(
        tx.$transaction(async (inner) => {
          await inner.$executeRawUnsafe(`INSERT INTO ${table}_log (key) VALUES ('inner')`);
          throw new Error('inner fails');
        }),
      ).rejects.toThrow('inner fails');
    });
    expect(
      await prisma.$queryRawUnsafe(`SELECT key FROM ${table}_log WHERE key IN ('outer', 'inner')`),
    ).toEqual([{ key: 'outer' }]);
  });

  test('a client whose database cannot be told is refused at construction', () => {
    const client = { $transaction: prisma.$transaction.bind(prisma) };
    expect(() => prismaTransactions(client)).toThrow(/dialect/);
    expect(prismaTransactions(client, { dialect: 'mysql' }).dialect).toBe('mysql');
  });
});
