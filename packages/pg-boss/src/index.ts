/**
 * Idempotent pg-boss workers for oncely: each job's work runs once per key, and in transactional mode its writes
 * commit with the job's idempotency record in one PostgreSQL transaction.
 *
 * @module @oncely/pg-boss
 */
import { createHash } from 'node:crypto';
import {
  type Duration,
  IdempotencyOptionsError,
  type IdempotencyStore,
  InvalidValueError,
  type JsonStorable,
  OncelyError,
} from '@oncely/core';
import {
  type ConsumerBroker,
  type ConsumerOptions,
  type ConsumerSettledEvent,
  consumerRuntime,
  type TransactionalIdempotencyStore,
} from '@oncely/core/adapter';

/** What the wrapper reads of a pg-boss job (`PgBoss.Job`, or `JobWithMetadata` with `includeMetadata: true`). */
export interface PgBossJob<T = unknown> {
  /** The job's id: how it is completed or cancelled, never its key (a job sent twice has two ids). */
  id: string;
  /** The queue's name. */
  name: string;
  /** The job's data: where the default key is read (`idempotencyKey`), and what the fingerprint is computed from. */
  data: T;
  /**
   * How long pg-boss lets the job stay active: the longest an in-progress duplicate waits in the worker. (pg-boss 10
   * reads it as a PostgreSQL `numeric`, which `pg` hands over as a string such as `'30.000000'`.)
   */
  expireInSeconds?: number | string;
  /** With `includeMetadata: true`: earlier attempts, reported as `failures` in `onSettled`. */
  retryCount?: number;
  /** With `includeMetadata: true`: the attempts pg-boss allows; the last failed one is reported as `dead-letter`. */
  retryLimit?: number;
  /** With `includeMetadata: true`: seconds before a retry, reported as `delayMs` in `onSettled`. */
  retryDelay?: number;
  /** With `includeMetadata: true`: whether pg-boss doubles `retryDelay` on each retry. */
  retryBackoff?: boolean;
}

/** The pg-boss calls the wrapper makes (a `PgBoss` instance has them). */
export interface PgBossClient {
  /** Completes job `id` of queue `name` with `data` as its output: how a job that ran, or a duplicate, is settled. */
  complete(name: string, id: string, data: object): Promise<unknown>;
  /** Cancels job `id` of queue `name`: how a job no retry can help is settled, so that pg-boss never retries it. */
  cancel(name: string, id: string): Promise<unknown>;
}

/** A store that runs work in one transaction with its record: `PostgresStore` from `@oncely/postgres`. */
export interface TransactionalStore<Db> {
  /**
   * Runs `work` once per key, in one transaction that also writes the key's record; a duplicate gets the stored
   * result instead, a key reused with another fingerprint an error, and an error thrown by `work` rolls it all back.
   */
  transaction<T>(
    key: string,
    options: { fingerprint?: string; ttl?: Duration },
    work: (db: Db) => Promise<T>,
  ): Promise<{
    /** `'executed'`: `work` ran and committed now; `'replayed'`: an earlier run's stored result. */
    outcome: 'executed' | 'replayed';
    /** What `work` returned, now or in the run whose result was stored. */
    result: T;
  }>;
}

/** What `fn` gets besides the job. */
export interface JobContext {
  /** The job's idempotency key (`undefined` only with `onMissingKey: 'process'`). */
  key: string | undefined;
}

/** What `fn` gets in transactional mode: `db` is the transaction that also commits the key's record. */
export interface TransactionalJobContext<Db> {
  /** The job's idempotency key (every job has one in transactional mode: those without are cancelled). */
  key: string;
  /** The transaction's client (a pg `PoolClient`): write through it, and your writes commit with the record. */
  db: Db;
}

/**
 * What `fn` may return: nothing (the job completes with `{ value: null }`), or a value JSON can store and give back
 * to a duplicate (see `JsonStorable` in `@oncely/core`): a BigInt, a Map or a Set does not compile.
 */
export type PgBossStorable<R> = R extends void ? R : JsonStorable<R>;

/** What the wrapper did with one job, for metrics and logs. */
export type PgBossSettledEvent<J extends PgBossJob = PgBossJob> = ConsumerSettledEvent<J>;

/**
 * The shared consumer options (docs/consumers.md) except `maxAttempts` and `retryDelay`: pg-boss retries failed
 * jobs itself (`retryLimit`, `retryDelay`, `retryBackoff` on the queue or the job).
 */
export interface PgBossWorkerOptions<J extends PgBossJob = PgBossJob>
  extends Omit<ConsumerOptions<J>, 'maxAttempts' | 'retryDelay'> {
  /** The `PgBoss` instance whose `work()` runs the handler: jobs are completed and cancelled one by one. */
  boss: PgBossClient;
  /** The key of a job. Default: `job.data.idempotencyKey` (a string, or a number). */
  key?: (job: J) => string | undefined;
  /** `true`: run `fn` in one transaction with the key's record (needs a `PostgresStore`). Default: `false`. */
  transactional?: false;
}

/** Transactional mode: `fn(job, { key, db })` writes through `db`; its writes and the record commit together. */
export interface PgBossTransactionalWorkerOptions<J extends PgBossJob, Db>
  extends Omit<PgBossWorkerOptions<J>, 'transactional' | 'store' | 'lockTimeout' | 'inProgress'> {
  /** Selects transactional mode: `fn` gets `{ key, db }`, and its writes through `db` commit with the record. */
  transactional: true;
  /** A `PostgresStore` in the database your writes go to. */
  store: IdempotencyStore & TransactionalStore<Db>;
}

/** Thrown (so that pg-boss fails them, and retries them per its `retryLimit`) for jobs that must run again. */
export class JobsToRetryError extends OncelyError {
  /** The ids of the jobs left for pg-boss to fail, with why. */
  readonly jobs: ReadonlyArray<{
    /** The job's id. */
    id: string;
    /** The job's idempotency key, when it has one. */
    key: string | undefined;
    /** Why it must run again: the settlement's reason, as `onSettled` reports it, or `'settle-failed'`. */
    reason: string;
    /** The error it failed with, if any; the first job's is also this error's `cause`. */
    error?: unknown;
  }>;

  /** Made by the worker for the jobs of one batch that must run again; `jobs` is the property of that name. */
  constructor(jobs: JobsToRetryError['jobs']) {
    const first = jobs[0]?.error;
    super(
      jobs.length === 1 && first instanceof Error
        ? first.message
        : `oncely: ${jobs.length} job(s) to retry: ${jobs.map((j) => `${j.id} (${j.reason})`).join(', ')}`,
      first === undefined ? undefined : { cause: first },
    );
    this.name = 'JobsToRetryError';
    this.jobs = jobs;
  }
}

const NOT_FOR_PG_BOSS: Record<string, string> = {
  maxAttempts:
    'is not used by @oncely/pg-boss: pg-boss retries failed jobs itself. Set retryLimit on the queue (boss.createQueue(name, { retryLimit })) or the job (boss.send(name, data, { retryLimit })).',
  retryDelay:
    'is not used by @oncely/pg-boss: pg-boss retries failed jobs itself. Set retryDelay (seconds) and retryBackoff on the queue or the job.',
};
const NOT_TRANSACTIONAL: Record<string, string> = {
  lockTimeout:
    'has no effect with transactional: true: the open transaction holds the key, and a crashed worker releases it at once (PostgreSQL rolls its transaction back). Remove it.',
  inProgress:
    'has no effect with transactional: true: a duplicate of a running transaction waits in the worker (see inProgressDelay). Remove it.',
};

/**
 * How many times each `PgBoss` instance has stopped (its `stopped` event; one listener per instance, however many
 * wrappers share it). A job waiting in the worker stops waiting once its boss has stopped: pg-boss has failed it
 * (`failWip`) and closed its connections, so looking again could only run `fn` after shutdown.
 */
const stopsOf = new WeakMap<object, { count: number }>();
function stopCounter(boss: object): { count: number } {
  let counter = stopsOf.get(boss);
  if (counter === undefined) {
    const stops = { count: 0 };
    counter = stops;
    stopsOf.set(boss, stops);
    const emitter = boss as { on?: (event: string, listener: () => void) => unknown };
    if (typeof emitter.on === 'function') {
      emitter.on('stopped', () => {
        stops.count++;
      });
    }
  }
  return counter;
}

/**
 * Wraps a pg-boss work handler so that each job's `fn` runs at most once per key across every worker sharing the
 * store, then settles each job of the batch on its own:
 *
 * - `fn` finished, or the key was already done (a duplicate) → `boss.complete(name, id, result)`: a duplicate's
 *   output is the stored result;
 * - the key is held by a running worker (or the store is unreachable) → the job waits in the worker, looked at
 *   again every `inProgressDelay`, without counting an attempt, while its `expireInSeconds` allows; after that it
 *   is left to pg-boss to fail (one attempt counted);
 * - `fn` threw → pg-boss fails the job, and retries it per its `retryLimit`, `retryDelay`, `retryBackoff`;
 * - no retry can help (a permanent error, no key, a key reused for other data) → `boss.cancel(name, id)`: not
 *   retried (pg-boss 10 cannot fail a job before its retries are used up).
 *
 * ```ts
 * await boss.work('ship', idempotentWorker(ship, { boss, store: new PostgresStore({ pool }), transactional: true }));
 * ```
 */
export function idempotentWorker<J extends PgBossJob, Db, R = unknown>(
  fn: (
    job: J,
    context: TransactionalJobContext<Db>,
  ) => (R & PgBossStorable<R>) | Promise<R & PgBossStorable<R>>,
  options: PgBossTransactionalWorkerOptions<J, Db>,
): (jobs: J[]) => Promise<void>;
export function idempotentWorker<J extends PgBossJob, R = unknown>(
  fn: (job: J, context: JobContext) => (R & PgBossStorable<R>) | Promise<R & PgBossStorable<R>>,
  options: PgBossWorkerOptions<J>,
): (jobs: J[]) => Promise<void>;
export function idempotentWorker<J extends PgBossJob, Db>(
  fn: (job: J, context: TransactionalJobContext<Db>) => unknown,
  options: PgBossWorkerOptions<J> | PgBossTransactionalWorkerOptions<J, Db>,
): (jobs: J[]) => Promise<void> {
  if (typeof fn !== 'function') {
    throw new IdempotencyOptionsError(
      'handler',
      `must be a function (job, { key }) => work; got ${typeof fn}.`,
    );
  }
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object with at least { boss }: idempotentWorker(fn, { boss, store }).',
    );
  }
  const {
    boss,
    key: keySource,
    transactional,
    ...shared
  } = options as Omit<PgBossWorkerOptions<J>, 'transactional'> & {
    transactional?: unknown;
  };
  for (const [name, fix] of Object.entries(NOT_FOR_PG_BOSS)) {
    if (name in shared) throw new IdempotencyOptionsError(name, fix);
  }
  if (
    boss === null ||
    typeof boss !== 'object' ||
    typeof boss.complete !== 'function' ||
    typeof boss.cancel !== 'function'
  ) {
    throw new IdempotencyOptionsError(
      'boss',
      'must be the PgBoss instance whose work() runs this handler: each job of a batch is completed or cancelled on its own.',
    );
  }
  if (transactional !== undefined && typeof transactional !== 'boolean') {
    throw new IdempotencyOptionsError(
      'transactional',
      `must be true or false; got ${JSON.stringify(transactional)}.`,
    );
  }
  const givenKeyOf = resolveKey(keySource);
  // The runtime reads the key once per decision; fn gets that same key rather than a second call of the key
  // function (which could give another answer than the key that was protected).
  const decidedKeys = new WeakMap<object, string | undefined>();
  const keyOf = (job: J): string | undefined => {
    const key = givenKeyOf(job);
    if (job !== null && typeof job === 'object') decidedKeys.set(job, key);
    return key;
  };
  let runInTransaction: ConsumerBroker<J>['runInTransaction'];
  let workInTransaction: ConsumerBroker<J>['workInTransaction'];
  if (transactional === true) {
    const store = shared.store as Partial<TransactionalStore<Db>> | undefined;
    if (store === undefined || typeof store?.transaction !== 'function') {
      throw new IdempotencyOptionsError(
        'store',
        'must be a PostgresStore (from @oncely/postgres) with transactional: true: the job’s writes and its record commit in one PostgreSQL transaction. Pass store: new PostgresStore({ pool }), or drop transactional.',
      );
    }
    for (const [name, fix] of Object.entries(NOT_TRANSACTIONAL)) {
      if (name in shared) throw new IdempotencyOptionsError(name, fix);
    }
    if (shared.onMissingKey === 'process') {
      throw new IdempotencyOptionsError(
        'onMissingKey',
        "cannot be 'process' with transactional: true: a job without a key has no record to commit with its writes. Give every job a key, or leave onMissingKey out (such jobs are cancelled).",
      );
    }
    // The result is stored as JSON: "nothing" is stored as null rather than refused.
    const work = async (job: J, key: string, db: Db) => (await fn(job, { key, db })) ?? null;
    if (typeof (store as Partial<TransactionalIdempotencyStore>).acquireInTransaction === 'function') {
      // PostgresStore: the runtime runs the transaction (its key protocol, hooks and timings).
      workInTransaction = (job, key, db) => work(job, key, db as Db);
    } else {
      const transactionalStore = store as TransactionalStore<Db>;
      runInTransaction = (job, key, fingerprint, observe) =>
        transactionalStore.transaction(
          key,
          {
            ...(shared.ttl === undefined ? {} : { ttl: shared.ttl }),
            ...(fingerprint === undefined ? {} : { fingerprint }),
          },
          (db: Db) => observe.execute(key, () => work(job, key, db)),
        );
    }
  }
  const runtime = consumerRuntime<J>(
    // Plain mode: fn was given as (job, { key }) => ..., and gets no db.
    async (job) =>
      (await fn(job, {
        key: decidedKeys.has(job) ? decidedKeys.get(job) : givenKeyOf(job),
      } as TransactionalJobContext<Db>)) ?? null,
    // pg-boss counts attempts and decides when they are used up; the runtime never dead-letters for exhaustion.
    { ...shared, maxAttempts: Number.MAX_SAFE_INTEGER },
    {
      name: '@oncely/pg-boss',
      // Read (and removed) above; listed so that the unknown-option error names them.
      options: ['boss', 'key', 'transactional'],
      keyOf,
      fingerprint: dataHash,
      storeResults: true,
      ...(runInTransaction === undefined ? {} : { runInTransaction }),
      ...(workInTransaction === undefined ? {} : { workInTransaction }),
    },
  );
  const { log } = runtime;
  const stops = stopCounter(boss);

  /** Decides and settles one job; resolves to why pg-boss must fail it, or `undefined` once it is settled. */
  const handle = (job: J): Promise<JobsToRetryError['jobs'][number] | undefined> => {
    const stopsBefore = stops.count;
    const retryDelay = numberOrUndefined(job.retryDelay);
    return runtime.settleInWorker(
      job,
      {
        id: job.id,
        failuresBefore: numberOrUndefined(job.retryCount) ?? 0,
        expiresAt: Date.now() + (Number(job.expireInSeconds) || 0) * 1000,
        stopped: () => stops.count !== stopsBefore,
        // pg-boss 10's failJobs: retryDelay seconds, or with retryBackoff retryDelay * 2^min(16, n + 1) / 2 (plus
        // as much again at random), so at most 15 doublings. Known with includeMetadata: true.
        retries: {
          limit: numberOrUndefined(job.retryLimit),
          delayMs: retryDelay === undefined ? undefined : retryDelay * 1000,
          backoff: job.retryBackoff === true,
          maxDoublings: 15,
        },
      },
      {
        ack: (result) => boss.complete(job.name, job.id, outputOf(result)),
        deadLetter: () => boss.cancel(job.name, job.id),
        deadLetterWord: 'cancelled',
      },
    );
  };

  return async (jobs: J[]): Promise<void> => {
    const outcomes = await Promise.all(
      jobs.map((job) =>
        handle(job).catch((error: unknown) => {
          // Not expected (decide never rejects, settle failures are handled): still, never complete such a job.
          log.error({ err: error, jobId: job.id }, 'oncely: could not settle a job; pg-boss will retry it');
          return { id: job.id, key: undefined, reason: 'settle-failed', error };
        }),
      ),
    );
    const toRetry = outcomes.filter((o) => o !== undefined);
    // Throwing makes pg-boss fail the jobs still active (only these: the others are completed or cancelled already),
    // through its own retry policy. Resolving would make it complete them.
    if (toRetry.length > 0) throw new JobsToRetryError(toRetry);
  };
}

function numberOrUndefined(value: unknown): number | undefined {
  const n = typeof value === 'string' ? Number(value) : value;
  return typeof n === 'number' && Number.isFinite(n) ? n : undefined;
}

/** pg-boss keeps an object as a job's output: anything else is wrapped as `{ value }`, as pg-boss itself does. */
function outputOf(result: unknown): object {
  if (result !== null && typeof result === 'object' && !Array.isArray(result)) return result;
  return { value: result ?? null };
}

function dataHash(job: PgBossJob): string {
  // job.data comes back from jsonb, whose key order is canonical: equal data gives equal text.
  return createHash('sha256')
    .update(JSON.stringify(job.data ?? null))
    .digest('base64url');
}

function resolveKey<J extends PgBossJob>(source: unknown): (job: J) => string | undefined {
  if (source === undefined) {
    return (job) => {
      const data = job.data as { idempotencyKey?: unknown } | null | undefined;
      const key = data !== null && typeof data === 'object' ? data.idempotencyKey : undefined;
      return typeof key === 'string' ? key : typeof key === 'number' ? String(key) : undefined;
    };
  }
  if (typeof source === 'function') {
    return (job) => {
      const key: unknown = source(job);
      if (key === undefined || typeof key === 'string') return key;
      // Thrown inside the runtime's keyOf: the job is settled as invalid-key, not run with a made-up key.
      throw new InvalidValueError(`the key function must return a string or undefined; got ${typeof key}`);
    };
  }
  throw new IdempotencyOptionsError(
    'key',
    `must be a function (job) => string | undefined; got ${JSON.stringify(source)}. Leave it out to use job.data.idempotencyKey.`,
  );
}
