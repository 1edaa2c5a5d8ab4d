import { checkLogger, durationOption, inProgressOption } from '../shared/checks';
import type { Duration } from '../shared/duration';
import { IdempotencyOptionsError } from '../shared/errors';
import { type DecisionOutcome, HookRunner } from '../shared/hooks';
import { type Logger, silentLogger } from '../shared/logger';
import { hooksOf, type ObservableOptions, observedStore } from '../shared/observe';
import { checkKey, fingerprintOf, KeyProtocol, type LeaseSettings } from '../shared/protocol';
import { tell, type WarningCode } from '../shared/warnings';
import type { IdempotencyStore, TransactionalIdempotencyStore } from '../stores/store';
import {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyStoreError,
} from './errors';
import { leasedOutcome } from './idempotent';
import {
  CONSUMER_RETRY_OPTIONS,
  type ConsumerRetryOptions,
  type ConsumerRetryPolicy,
  type ConsumerSettlement,
  resolveConsumerRetryPolicy,
  settlementFor,
} from './retry';
import { transactOnce } from './transaction';
import { type HandedBack, settleInWorker, type WorkerDelivery, type WorkerVerbs } from './worker-settlement';

// The consumers' counterpart of the HTTP engine: one place decides what happens to a delivery (run, replay, wait,
// retry, dead-letter); a broker package reads keys from its message type and turns the settlement into its verbs.

/** What a broker wrapper did with one delivery, for metrics and logs (`onSettled`). */
export interface ConsumerSettledEvent<M> {
  /** The idempotency key, or `undefined` when the message had none. */
  key: string | undefined;
  /** `ack`: done (or a duplicate); `delay`/`retry`: looked at again later; `dead-letter`: handed to the dead-letter destination. */
  action: ConsumerSettlement['action'];
  /** Why, as in the settlement: `executed`, `replayed`, `in-progress`, `retries-exhausted`… */
  reason: ConsumerSettlement['reason'];
  /** Failed attempts counted for this message so far (after this delivery). */
  failures: number;
  /** The delay before the message comes back, for `delay` and `retry`. */
  delayMs?: number;
  /** The handler's (or store's) error, when there was one. */
  error?: unknown;
  /** The message delivered. */
  message: M;
}

/** The options every broker wrapper takes, with the same names and defaults; `M` is the broker's message type. */
export interface ConsumerOptions<M> extends ConsumerRetryOptions, ObservableOptions {
  /** Where records live. Default: a new `MemoryStore()` (one process; competing consumers need a shared store). */
  store?: IdempotencyStore;
  /**
   * A message without a key: `'dead-letter'` hands it to the dead-letter destination; `'process'` runs the handler
   * without idempotency protection. Default: `'dead-letter'`.
   */
  onMissingKey?: 'dead-letter' | 'process';
  /** What must match when a key is reused (else dead-letter), or `false`. Default: SHA-256 of the message's bytes. */
  fingerprint?: ((msg: M) => string) | false;
  /** How long a finished message's record is kept: duplicates within it are acked without running. Default: `'24h'`. */
  ttl?: Duration;
  /** Lease of a message being processed, renewed while the handler runs. Default: `'30s'`. */
  lockTimeout?: Duration;
  /** While another consumer processes the key: `'reject'` delays the message; `{ wait }` waits in-process first. */
  inProgress?:
    | 'reject'
    | {
        /** How long to wait for the running holder to finish before answering as `'reject'` would. */
        wait: Duration;
      };
  /** Longest key accepted; longer keys are dead-lettered. Default: `255`. */
  maxKeyLength?: number;
  /** A pino-compatible logger. Default: none. */
  logger?: Logger;
  /** Called after each delivery is settled. Exceptions are logged and ignored. */
  onSettled?: (event: ConsumerSettledEvent<M>) => void;
}

/** What a broker wrapper tells the runtime about its broker. */
export interface ConsumerBroker<M> {
  /** The package, for option errors: `'@oncely/amqp'`. */
  name: string;
  /** The options the wrapper reads itself, besides the shared ones: `key`, its own. */
  options: readonly string[];
  /** The key of a message, or `undefined` when it has none. May throw: the message is dead-lettered as `invalid-key`. */
  keyOf: (msg: M) => string | undefined;
  /** The fingerprint when the user gives none: a hash of the message's bytes. */
  fingerprint: (msg: M) => string;
  /**
   * Store the work's return value and hand it back in `ConsumerDecision.result` (executed and replayed alike), for
   * brokers where a job has a result (BullMQ). Default: `false`: `null` is stored, so any handler fits.
   */
  storeResults?: boolean;
  /**
   * The keyed work of a message, run in one transaction with its record instead of under `idempotent()`:
   * `options.store` must then run transactions (`acquireInTransaction`: a `PostgresStore`), and `db` is the
   * transaction's client, so the work's writes and the record commit together. The runtime runs the key protocol
   * (checks, acquire, replay, commit or rollback) and reports it to the hooks as it does the plain path's.
   * `lockTimeout` and `inProgress` have no effect on it and are refused (`IdempotencyOptionsError`).
   */
  workInTransaction?: (msg: M, key: string, db: unknown) => unknown;
  /**
   * Runs the keyed work in one transaction with its record through a store's own `transaction()` method, for a
   * store without `acquireInTransaction` (prefer `workInTransaction`). Gets the checked key and the
   * message's fingerprint (`undefined` with `fingerprint: false`); what it throws is settled by `settlementFor`
   * like any other error, so `IdempotencyInProgressError` delays the message. Default: none.
   */
  runInTransaction?: (
    msg: M,
    key: string,
    fingerprint: string | undefined,
    observe: TransactionObservation,
  ) => Promise<{
    /** `executed`: the work ran in this transaction; `replayed`: a completed record gave its result. */
    outcome: 'executed' | 'replayed';
    /** The work's return value, or the stored one for a duplicate. */
    result: unknown;
  }>;
}

/**
 * What the runtime hands `runInTransaction` so that the transactional path is observed like the plain one: run the
 * transaction on `store(yours)` (`runStoreTransaction(observe.store(store), ...)`) and the work inside
 * `execute(key, work)`, and `onStoreOperation`, `onExecutionStart`/`End` (hence `otel()`) see it all. The work must
 * run inside `execute`: what it throws is then settled as a failure of the work, whatever its class.
 */
export interface TransactionObservation {
  /** The store as the runtime observes it: timed when an `onStoreOperation` hook is set, else the store itself. */
  store(store: TransactionalIdempotencyStore): TransactionalIdempotencyStore;
  /** Runs the work, reported as an execution in flight under `key` while it runs. */
  execute<T>(key: string, work: () => Promise<T>): Promise<T>;
}

/** One delivery's decision. */
export interface ConsumerDecision {
  /** The delivery's idempotency key, or `undefined` when it had none. */
  key: string | undefined;
  /** How to settle the delivery. */
  settlement: ConsumerSettlement;
  /**
   * With `broker.storeResults`, on `ack` `executed`/`replayed`: the work's return value (this delivery's own run) or
   * the stored one (a duplicate, as JSON gave it back). Absent otherwise.
   */
  result?: unknown;
}

/** The consumers' engine, made once per wrapped handler by `consumerRuntime()`. */
export interface ConsumerRuntime<M> {
  /** The retry options after validation. */
  readonly policy: ConsumerRetryPolicy;
  /** The logger given in the options, or one that discards everything. */
  readonly log: Logger;
  /**
   * Decides one delivery, after `failuresBefore` failed attempts of the message: runs the work (the handler, or
   * `work` when the wrapper adds to it) at most once per key across every consumer sharing the store (or, without
   * a key and with `onMissingKey: 'process'`, unprotected), and says how to settle it. `lease` bounds or
   * accompanies this delivery's lease (Lambda's deadline, an SQS visibility heartbeat); in transactional mode the
   * open transaction holds the key and it has no effect. Never rejects.
   */
  decide(
    msg: M,
    failuresBefore: number,
    work?: () => unknown,
    lease?: LeaseSettings,
  ): Promise<ConsumerDecision>;
  /** The `onSettled` event of a delivery settled as `settlement`, with `failures` counted after it. */
  settledEvent(
    msg: M,
    key: string | undefined,
    settlement: ConsumerSettlement,
    failures: number,
  ): ConsumerSettledEvent<M>;
  /** Calls `onSettled` with `event`; its exceptions are logged and dropped (the delivery is settled already). */
  report(event: ConsumerSettledEvent<M>): void;
  /**
   * For a broker that counts attempts and retries failed messages itself, and whose worker holds a message while
   * it runs (pg-boss): decides the delivery, waits in the worker for a held key while the message's expiry allows,
   * acks or dead-letters it through `verbs` (tried again briefly on failure) and reports it to `onSettled`.
   * Resolves to `undefined` once settled, or to why the broker must fail it (reported as its retry, or as the
   * last attempt failed when `delivery.retries.limit` says so). Never rejects.
   */
  settleInWorker(msg: M, delivery: WorkerDelivery, verbs: WorkerVerbs): Promise<HandedBack | undefined>;
}

const SHARED_CONSUMER_OPTIONS = [
  'store',
  'onMissingKey',
  'fingerprint',
  'ttl',
  'lockTimeout',
  'inProgress',
  'maxKeyLength',
  'logger',
  'onSettled',
  'hooks',
  ...CONSUMER_RETRY_OPTIONS,
];

/**
 * Checks a broker wrapper's options once (throwing `IdempotencyOptionsError` naming the option) and returns the
 * runtime that decides its deliveries. All policy is here; the wrapper turns settlements into its broker's verbs.
 */
export function consumerRuntime<M>(
  handler: (msg: M) => unknown,
  options: ConsumerOptions<M>,
  broker: ConsumerBroker<M>,
): ConsumerRuntime<M> {
  if (typeof handler !== 'function') {
    throw new IdempotencyOptionsError('handler', `must be a function (msg) => work; got ${typeof handler}.`);
  }
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object; pass {} or leave it out for the defaults.',
    );
  }
  const known = new Set([...SHARED_CONSUMER_OPTIONS, ...broker.options]);
  for (const name of Object.keys(options)) {
    if (!known.has(name)) {
      throw new IdempotencyOptionsError(
        name,
        `is not an option of ${broker.name}; known options: ${[...known].join(', ')}.`,
      );
    }
  }
  const log = options.logger === undefined ? silentLogger : checkLogger(options.logger);
  // The process warnings this handler already emitted (without a logger): said once each.
  const warned = new Set<WarningCode>();
  const policy = resolveConsumerRetryPolicy(options, log);
  const processWithoutKey = checkOnMissingKey(options.onMissingKey);
  const fingerprint = options.fingerprint;
  if (fingerprint !== undefined && fingerprint !== false && typeof fingerprint !== 'function') {
    throw new IdempotencyOptionsError(
      'fingerprint',
      `must be a function (msg) => string, or false to disable the check; got ${typeof fingerprint}.`,
    );
  }
  const onSettled = options.onSettled;
  if (onSettled !== undefined && typeof onSettled !== 'function') {
    throw new IdempotencyOptionsError('onSettled', `must be a function; got ${typeof onSettled}.`);
  }
  const { keyOf } = broker;
  // Observation hooks (and otel()'s), handed to leasedOutcome; `decided` reports what it never sees: keys it is
  // not given, and the transactional path, which bypasses it.
  const hooks = hooksOf(options);
  const runner = new HookRunner(hooks ?? {}, 'consumer', warned);
  const decided = (outcome: DecisionOutcome, key?: string): void =>
    runner.decided(outcome, key, undefined, log);
  const rejected = (): void => decided('rejected');
  // The transactional path's store timings and executions in flight, as idempotent() reports the plain path's.
  let observed: { given: TransactionalIdempotencyStore; wrapped: TransactionalIdempotencyStore } | undefined;
  const observation: TransactionObservation = {
    store(store) {
      if (hooks?.onStoreOperation === undefined) return store;
      if (observed?.given !== store) {
        const wrapped = observedStore(store, 'consumer', hooks, (event) =>
          runner.run('onStoreOperation', event, log),
        );
        observed = { given: store, wrapped };
      }
      return observed.wrapped;
    },
    async execute(key, work) {
      if (hooks?.onExecutionStart === undefined && hooks?.onExecutionEnd === undefined) return work();
      runner.executionStarted(key, log);
      try {
        return await work();
      } finally {
        runner.executionEnded(key, log);
      }
    },
  };

  // Unless the broker asks for results, the work's own result is not a consumer's business: `null` is what gets
  // stored, so any handler fits.
  const storeResults = broker.storeResults === true;
  const run = leasedOutcome(
    async (_msg: M, _key: string, work: () => unknown): Promise<unknown> => {
      const value = await work();
      return storeResults ? value : null;
    },
    {
      key: (_msg, key) => key,
      fingerprint: fingerprint === false ? false : (msg) => (fingerprint ?? broker.fingerprint)(msg),
      isPermanent: policy.isPermanent,
      ...(options.store === undefined ? {} : { store: options.store }),
      ...(options.ttl === undefined ? {} : { ttl: options.ttl }),
      ...(options.lockTimeout === undefined ? {} : { lockTimeout: options.lockTimeout }),
      ...(options.inProgress === undefined ? {} : { inProgress: options.inProgress }),
      ...(options.maxKeyLength === undefined ? {} : { maxKeyLength: options.maxKeyLength }),
      ...(options.logger === undefined ? {} : { logger: options.logger }),
      ...(hooks === undefined ? {} : { hooks }),
    },
  );
  // The transactional path bypasses leasedOutcome, so it checks the key and fingerprint the same way here.
  const { runInTransaction, workInTransaction } = broker;
  // With inProgress: { wait }, each look at a held key may itself wait this long in the store.
  const storeWaitMs = inProgressOption(options.inProgress) ?? 0;
  const maxKeyLength = options.maxKeyLength ?? 255;
  const transactional =
    workInTransaction === undefined ? undefined : transactionalProtocol(options, runner, log, broker.name);
  const inTransaction = async (
    msg: M,
    key: string,
    workThrew: () => void,
  ): Promise<{ outcome: 'executed' | 'replayed'; result: unknown }> => {
    let messageFingerprint: string | undefined;
    try {
      checkKey(key, maxKeyLength);
      if (fingerprint !== false) messageFingerprint = fingerprintOf(fingerprint ?? broker.fingerprint, [msg]);
    } catch (error) {
      rejected();
      throw error;
    }
    if (workInTransaction !== undefined && transactional !== undefined) {
      // What the work throws is marked, so that an oncely error class thrown by the work (an inner idempotent()
      // call's) is settled as a failure of the work, not as this key's own conflict (which would delay it).
      return transactOnce(
        transactional.protocol,
        key,
        messageFingerprint,
        transactional.ttlMs,
        async (db: unknown) => {
          try {
            const value = await workInTransaction(msg, key, db);
            return storeResults ? value : null;
          } catch (error) {
            workThrew();
            throw error;
          }
        },
        log,
      );
    }
    const transaction = runInTransaction as NonNullable<ConsumerBroker<M>['runInTransaction']>;
    try {
      // The work runs inside the broker's transaction, past decide()'s own wrapper: what it throws is marked here,
      // so that an oncely error class thrown by the work (an inner idempotent() call's) is settled as a failure
      // of the work, not as this key's own conflict or unstorable result (which would complete the job).
      const done = await transaction(msg, key, messageFingerprint, {
        store: (store) => observation.store(store),
        execute: (executionKey, work) =>
          observation.execute(executionKey, async () => {
            try {
              return await work();
            } catch (error) {
              workThrew();
              throw error;
            }
          }),
      });
      decided(done.outcome, key);
      return done;
    } catch (error) {
      const outcome = transactionOutcome(error);
      if (outcome !== undefined) decided(outcome, key);
      throw error;
    }
  };

  // Methods close over this object rather than read `this`, so a wrapper may pass them around destructured.
  const runtime: ConsumerRuntime<M> = {
    policy,
    log,
    async decide(msg, failuresBefore, givenWork = () => handler(msg), lease) {
      // Whether the work itself threw: its errors are failures of the work, whatever their class.
      let workThrew = false;
      const work = async (): Promise<unknown> => {
        try {
          return await givenWork();
        } catch (error) {
          workThrew = true;
          throw error;
        }
      };
      let key: string | undefined;
      try {
        key = keyOf(msg);
      } catch (error) {
        rejected();
        return {
          key: undefined,
          settlement: {
            action: 'dead-letter',
            reason: 'invalid-key',
            error: new IdempotencyKeyError('the key function threw', { cause: error }),
          },
        };
      }
      if (key === undefined || key === '') {
        if (!processWithoutKey) {
          rejected();
          return { key: undefined, settlement: { action: 'dead-letter', reason: 'missing-key' } };
        }
        tell(
          log,
          'warn',
          'ONCELY_MESSAGE_WITHOUT_KEY',
          {},
          log === silentLogger
            ? "oncely: message without an idempotency key processed WITHOUT protection (onMissingKey: 'process'). Said once; give a logger to see each."
            : 'oncely: message without an idempotency key processed WITHOUT protection',
          warned,
        );
        try {
          const value = await work();
          return {
            key: undefined,
            settlement: { action: 'ack', reason: 'executed' },
            ...(storeResults ? { result: value } : {}),
          };
        } catch (error) {
          return { key: undefined, settlement: settlementFor(policy, error, failuresBefore, workThrew) };
        }
      }
      try {
        const { outcome, result } =
          runInTransaction === undefined && transactional === undefined
            ? await run(lease, [msg, key, work])
            : await inTransaction(msg, key, () => {
                workThrew = true;
              });
        return { key, settlement: { action: 'ack', reason: outcome }, ...(storeResults ? { result } : {}) };
      } catch (error) {
        return { key, settlement: settlementFor(policy, error, failuresBefore, workThrew) };
      }
    },
    settledEvent(msg, key, settlement, failures) {
      const event: ConsumerSettledEvent<M> = {
        key,
        action: settlement.action,
        reason: settlement.reason,
        failures,
        message: msg,
      };
      if ('delayMs' in settlement) event.delayMs = settlement.delayMs;
      if ('error' in settlement && settlement.error !== undefined) event.error = settlement.error;
      return event;
    },
    settleInWorker(msg, delivery, verbs) {
      return settleInWorker(runtime, storeWaitMs, msg, delivery, verbs);
    },
    report(event) {
      if (onSettled === undefined) return;
      try {
        const returned: unknown = onSettled(event);
        // An async onSettled that rejects must not become an unhandled rejection (which ends a Node process).
        if (returned instanceof Promise) {
          returned.catch((error: unknown) =>
            log.error({ err: error }, 'oncely: onSettled rejected; ignored'),
          );
        }
      } catch (error) {
        log.error({ err: error }, 'oncely: onSettled threw; ignored');
      }
    },
  };
  return runtime;
}

/**
 * The decision a failed transaction stands for, as idempotent() reports it: another run holds the key (conflict),
 * the key was reused for other data (mismatch), the store failed (store_error). An error of the work itself was
 * reported as executed by nobody: the transaction rolled back, so nothing is counted (a retry decides again).
 */
function transactionOutcome(error: unknown): DecisionOutcome | undefined {
  if (error instanceof IdempotencyInProgressError) return 'conflict';
  if (error instanceof IdempotencyMismatchError) return 'mismatch';
  if (error instanceof IdempotencyStoreError) return 'store_error';
  return undefined;
}

/**
 * The protocol of a runtime whose work runs in the store's transactions: its store as observed (timed for
 * `onStoreOperation`), its hooks, and the record's `ttl`. Throws `IdempotencyOptionsError` for a store that cannot.
 */
function transactionalProtocol<M>(
  options: ConsumerOptions<M>,
  runner: HookRunner,
  log: Logger,
  name: string,
): { protocol: KeyProtocol; ttlMs: number } {
  const store = options.store as Partial<TransactionalIdempotencyStore> | undefined;
  if (store === undefined || typeof store.acquireInTransaction !== 'function') {
    throw new IdempotencyOptionsError(
      'store',
      `must be a store that runs transactions (a PostgresStore from @oncely/postgres) for ${name}'s transactional mode.`,
    );
  }
  // The open transaction holds the key and a crashed worker's rolls back: a lease to set or a holder to wait for in
  // the store would be silently ignored, so these are refused.
  for (const [option, why] of [
    ['lockTimeout', 'the open transaction holds the key, and a crashed worker releases it at once'],
    ['inProgress', 'a duplicate of a running transaction is told at once that the key is held, and delayed'],
  ] as const) {
    if (options[option] !== undefined) {
      throw new IdempotencyOptionsError(
        option,
        `has no effect in ${name}'s transactional mode: ${why}. Remove it.`,
      );
    }
  }
  const observed = observedStore(store as TransactionalIdempotencyStore, 'consumer', runner.hooks, (event) =>
    runner.run('onStoreOperation', event, log),
  );
  // The open transaction holds the key: the lease is never seen by another caller.
  return {
    protocol: new KeyProtocol(observed, runner, 30_000),
    ttlMs: options.ttl === undefined ? 86_400_000 : durationOption('ttl', options.ttl),
  };
}

function checkOnMissingKey(value: unknown): boolean {
  if (value === undefined || value === 'dead-letter') return false;
  if (value === 'process') return true;
  throw new IdempotencyOptionsError(
    'onMissingKey',
    `must be 'dead-letter' or 'process'; got ${JSON.stringify(value)}.`,
  );
}
