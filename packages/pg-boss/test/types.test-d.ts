// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles.
import type { PostgresStore } from '@oncely/postgres';
import type { PoolClient } from 'pg';
import type { PgBossClient, PgBossJob } from '../src/index';
import { idempotentWorker } from '../src/index';

declare const boss: PgBossClient;
type OrderJob = PgBossJob<{ orderId: string }>;
declare const store: PostgresStore;

export function resultsJsonCarriesCompile(): void {
  idempotentWorker(async (job: OrderJob) => ({ id: job.data.orderId, at: new Date() }), { boss });
  idempotentWorker(async (_job: OrderJob) => {}, { boss });
  idempotentWorker((_job: OrderJob) => null, { boss });
  idempotentWorker(async (_job: OrderJob, { db }) => ({ rows: (await db.query('SELECT 1')).rowCount }), {
    boss,
    store,
    transactional: true,
  });
}

export function resultsJsonCannotCarryDoNotCompile(): void {
  // @ts-expect-error a BigInt has no JSON form
  idempotentWorker(async (_job: OrderJob) => ({ total: 10n }), { boss });
  // @ts-expect-error a Map has no JSON form
  idempotentWorker(async (_job: OrderJob) => new Map<string, number>(), { boss });
  // @ts-expect-error a Set has no JSON form, in transactional mode too
  idempotentWorker(async (_job: OrderJob, _context: { key: string; db: PoolClient }) => new Set([1]), {
    boss,
    store,
    transactional: true,
  });
}
