import { randomBytes } from 'node:crypto';
import { waitUntil } from '@oncely/testing';
import pg from 'pg';
import PgBoss from 'pg-boss';

export const connectionString = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/**
 * Schemas of this test file's own (pg-boss's, and one for the store and the effects table), dropped in afterAll:
 * tests never touch shared tables.
 */
export function testDatabase() {
  const hex = randomBytes(6).toString('hex');
  const bossSchema = `oncely_pgboss_${hex}`;
  const schema = `oncely_test_${hex}`;
  let pool: pg.Pool | undefined;
  const bosses: PgBoss[] = [];
  return {
    bossSchema,
    schema,
    pool: () => {
      pool ??= new pg.Pool({ connectionString, max: 20 });
      return pool;
    },
    /** A started pg-boss in this file's schema (maintenance every second, so expiry is noticed quickly). */
    boss: async (): Promise<PgBoss> => {
      const boss = new PgBoss({
        connectionString,
        schema: bossSchema,
        max: 10,
        maintenanceIntervalSeconds: 1,
        monitorStateIntervalSeconds: 60,
      });
      boss.on('error', () => {});
      bosses.push(boss);
      await boss.start();
      return boss;
    },
    drop: async () => {
      for (const boss of bosses) await boss.stop({ graceful: false, wait: true }).catch(() => {});
      const p = pool ?? new pg.Pool({ connectionString, max: 2 });
      await p.query(`DROP SCHEMA IF EXISTS "${bossSchema}" CASCADE`);
      await p.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await p.end();
    },
  };
}

const FINAL = new Set(['completed', 'failed', 'cancelled']);

/** Waits until the job is completed, failed or cancelled; resolves to it (with its metadata). */
export async function settledJob(
  boss: PgBoss,
  queue: string,
  id: string,
  timeoutMs = 20_000,
): Promise<PgBoss.JobWithMetadata<unknown>> {
  let job: PgBoss.JobWithMetadata<unknown> | null = null;
  await waitUntil(
    async () => {
      job = await boss.getJobById(queue, id);
      return job !== null && FINAL.has(job.state);
    },
    `job ${id} to be settled`,
    timeoutMs,
  );
  return job as unknown as PgBoss.JobWithMetadata<unknown>;
}
