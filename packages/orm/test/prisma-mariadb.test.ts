/**
 * @services mariadb
 */
import { join } from 'node:path';
import { type OrmSuiteTarget, ormSuite, ormSuiteApp, ormSuiteId } from '@oncely/testing';
import request from 'supertest';
import type { Prisma } from './prisma/generated/mariadb/client';

jest.setTimeout(30_000);

ormSuite(join(__dirname, 'targets', 'prisma-mariadb.ts'));

describe('Prisma’s interactive transaction timeout on MariaDB', () => {
  let target: OrmSuiteTarget<Prisma.TransactionClient>;
  beforeAll(async () => {
    const { createTarget } = await import('./targets/prisma-mariadb');
    target = await createTarget({ id: ormSuiteId() }, { timeout: 1000 });
    await target.setup();
  });
  afterAll(async () => {
    await target.drop();
    await target.close();
  });

  test('a handler outlasting it fails; Prisma rolled back its insert and the record, and the retry runs', async () => {
    const { app, runs } = ormSuiteApp(target as OrmSuiteTarget<unknown>);
    const key = `${ormSuiteId()}-slow`;
    const slow = await request(app).post('/orders').set('Idempotency-Key', key).send({ holdMs: 2000 });
    // The handler's answer came too late: Prisma had rolled back, and the commit was refused.
    expect(slow.status).toBe(500);
    expect(slow.body.type).toMatch(/transaction-failed$/);
    expect(await target.countOrders(key)).toBe(0);
    expect(await target.store.get(key)).toBeUndefined();
    const retry = await request(app).post('/orders').set('Idempotency-Key', key).send({});
    expect(retry.status).toBe(201);
    expect(runs.get(key)).toBe(2);
    expect(await target.countOrders(key)).toBe(1);
  });
});
