// The ORM half of the unanswered-COMMIT tests: each target runs behind a proxy that closes the connection of the
// request's COMMIT once the server has committed it, so the ORM's transaction rejects with a lost connection.
import { join } from 'node:path';
import {
  type CommitCutter,
  expectCommitUnknown,
  loadOrmTarget,
  type OrmSuiteTarget,
  onceFree,
  ormSuiteApp,
  ormSuiteId,
  startCommitCutter,
} from '@oncely/testing';
import request from 'supertest';

/**
 * Registers, for each target module (file name under `targets/`), one test: the request whose COMMIT's answer is lost
 * gets 503 `commit-outcome-unknown`, and the retry replays what committed (1 run, 1 row). Every connection of the
 * file goes through a proxy of `protocol`, as the targets read their URL from `urlVariable` when loaded.
 * `refusingCommit`, given, makes the server refuse at COMMIT an order of key `refused` in target `id`'s tables: that
 * request must stay a 500 `transaction-failed`.
 */
export function commitCutSuite(
  protocol: 'postgres' | 'mysql',
  urlVariable: 'DATABASE_URL' | 'MYSQL_URL',
  defaultUrl: string,
  targets: string[],
  refusingCommit?: (id: string) => Promise<void>,
): void {
  const id = ormSuiteId();
  let cutter: CommitCutter;
  const loaded: OrmSuiteTarget<unknown>[] = [];

  beforeAll(async () => {
    const url = new URL(process.env[urlVariable] ?? defaultUrl);
    const port = Number(url.port || (protocol === 'postgres' ? 5432 : 3306));
    cutter = await startCommitCutter(protocol, { host: url.hostname, port });
    url.host = `127.0.0.1:${cutter.port}`;
    process.env[urlVariable] = url.toString();
  });
  afterEach(() => cutter.disarm());
  afterAll(async () => {
    for (const target of loaded) {
      await target.drop().catch(() => {});
      await target.close().catch(() => {});
    }
    await cutter?.close();
  });

  test.each(targets)(
    '%s: the COMMIT answer lost is a 503 commit-outcome-unknown, and the retry replays',
    async (module) => {
      const targetId = `${id}${loaded.length}`;
      const target = await loadOrmTarget(join(__dirname, 'targets', `${module}.ts`), targetId);
      loaded.push(target);
      await target.setup();
      const { app, runs } = ormSuiteApp(target);
      const send = (key: string) => request(app).post('/orders').set('Idempotency-Key', key).send({});
      if (refusingCommit !== undefined) {
        await refusingCommit(targetId);
        const refused = await send('refused');
        expect(refused.status).toBe(500);
        expect(refused.body.type).toBe('https://oncely.dev/problems/transaction-failed');
        expect(await target.countOrders('refused')).toBe(0);
      }
      const cut = cutter.cutNextCommit('answer-lost');
      const first = await send('cut');
      await cut;
      expectCommitUnknown(first);
      expect(await target.countOrders('cut')).toBe(1);
      const retry = await onceFree(() => send('cut'));
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(runs.get('cut')).toBe(1);
      expect(await target.countOrders('cut')).toBe(1);
    },
  );
}
