// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles.
import { type JsonStorable, MemoryStore } from '@oncely/core';
import { type Job, Worker } from 'bullmq';
import { type BullmqResult, type BullmqStorable, idempotentProcessor } from '../src/index';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only when `A` and `B` are the same type. */
const same = <A, B>(_proof: Equal<A, B>): void => undefined;

const store = new MemoryStore();
type OrderJob = Job<{ orderId: string }>;
const key = (job: OrderJob) => job.data.orderId;

export function jobsCompleteWithWhatJsonGivesBack(): void {
  const charge = idempotentProcessor(async (job: OrderJob) => ({ id: job.data.orderId, at: new Date() }), {
    store,
    key,
  });
  same<Awaited<ReturnType<typeof charge>>, { id: string; at: string }>(true);
  const nothing = idempotentProcessor(async (_job: OrderJob) => {}, { store, key });
  same<Awaited<ReturnType<typeof nothing>>, null>(true);
  // The processor is what a Worker takes, its result type the JSON form.
  const worker = new Worker('orders', charge, { connection: {} });
  same<typeof worker, Worker<{ orderId: string }, { id: string; at: string }>>(true);
}

export function resultsJsonCannotCarryDoNotCompile(): void {
  // @ts-expect-error a BigInt has no JSON form (BullMQ would complete the job with null)
  idempotentProcessor(async (_job: OrderJob) => ({ total: 10n }), { store, key });
  // @ts-expect-error a Map has no JSON form
  idempotentProcessor(async (_job: OrderJob) => new Map<string, number>(), { store, key });
}

type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

export function recursiveJsonTypesCompile(): void {
  const report = idempotentProcessor(
    async (_job: OrderJob): Promise<{ at: Date; data: Json }> => ({ at: new Date(), data: [] }),
    {
      store,
      key,
    },
  );
  same<Awaited<ReturnType<typeof report>>, { at: string; data: Json }>(true);
}

export function genericHelpersStateThatTheirResultIsStorable(): void {
  // A generic helper states that its R must be storable, and passes R on.
  function onceFor<R>(
    fn: (job: OrderJob) => Promise<R & BullmqStorable<R>>,
  ): (job: OrderJob) => Promise<BullmqResult<R>> {
    return idempotentProcessor<R, OrderJob>(fn, { store, key });
  }
  const charge = onceFor(async (job) => ({ id: job.data.orderId, at: new Date() }));
  same<Awaited<ReturnType<typeof charge>>, { id: string; at: string }>(true);
  // @ts-expect-error a BigInt has no JSON form, through the helper too
  onceFor(async () => ({ total: 10n }));
  const storable: JsonStorable<{ total: number }> = { total: 1 };
  void storable;
}
