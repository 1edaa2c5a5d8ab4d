import type { IdempotencyStore, StoreTransaction } from '../stores/store';
import { IdempotencyOptionsError } from './errors';
import type {
  AdapterKind,
  IdempotencyHooks,
  StoreOperation,
  StoreOperationEvent,
  UnconfirmedWriteEvent,
  UnconfirmedWriteOutcome,
} from './hooks';
import type { Logger } from './logger';

// The one place where the engine and idempotent() (hence every consumer) report what the other hooks cannot see:
// decisions, store operation durations and executions in flight. The logger, user hooks and @oncely/opentelemetry
// all read these same events. With none of these hooks set nothing here runs: the store is used as given and no
// clock is read, so the hot path pays nothing for them.

/**
 * The confirmation a store error carries when the store goes on confirming the write in the background
 * (RedisStore's `waitForReplicas`, whether its write was not confirmed in time or failed without a reply): a
 * `confirmation` promise of how it ended. Read by shape, so that any store can offer it; `undefined` for any other
 * error.
 */
export function pendingConfirmation(error: unknown): Promise<UnconfirmedWriteOutcome> | undefined {
  if (typeof error !== 'object' || error === null) return undefined;
  try {
    const { confirmation } = error as { confirmation?: unknown };
    if (typeof (confirmation as { then?: unknown } | null)?.then !== 'function') return undefined;
    return confirmation as Promise<UnconfirmedWriteOutcome>;
  } catch {
    return undefined; // a getter that throws: an error like any other
  }
}

/**
 * Reports an unconfirmed write to `onUnconfirmedWrite` (`report`), now and when its confirmation ends, and logs
 * how it ended. Returns false, doing nothing, when `error` carries no confirmation.
 */
export function followConfirmation(
  error: unknown,
  event: { adapter: AdapterKind; key: string; operation: 'complete' | 'release' },
  report: (event: UnconfirmedWriteEvent) => void,
  log: Logger,
): boolean {
  const confirmation = pendingConfirmation(error);
  if (confirmation === undefined) return false;
  report({ ...event, outcome: 'unconfirmed' });
  confirmation.then(
    (outcome) => {
      // Runs long after the request: a hook or a logger that throws here would be an unhandled rejection.
      try {
        report({ ...event, outcome });
        logConfirmation(log, event, outcome);
      } catch {
        // the hook's and the logger's own failure, with nobody left to answer
      }
    },
    () => {},
  );
  return true;
}

function logConfirmation(
  log: Logger,
  event: { key: string; operation: 'complete' | 'release' },
  outcome: UnconfirmedWriteOutcome,
): void {
  const fields = { key: event.key, operation: event.operation, outcome };
  if (outcome === 'confirmed') log.info(fields, 'oncely: the replicas confirmed the re-sent write');
  else if (event.operation === 'release')
    if (outcome === 'lost')
      log.info(
        fields,
        "oncely: the re-sent release found the key no longer this execution's (another request holds it, or it completed): nothing left to release",
      );
    else
      log.warn(fields, 'oncely: the release was never confirmed; the key frees itself when its lease ends');
  else if (outcome === 'expired')
    log.info(fields, "oncely: the unconfirmed response's ttl ran out before the replicas confirmed it");
  else
    log.error(
      fields,
      outcome === 'lost'
        ? "oncely: the unconfirmed response was lost (the key is no longer this execution's): a retry runs the handler again"
        : 'oncely: stopped re-sending the unconfirmed response (lockTimeout passed, or the store was closed): a failover that loses it lets a retry run the handler again',
    );
}

/**
 * Where `otel()` (and any other add-on) puts its hooks: a symbol, so that `{ ...options, ...otel() }` composes
 * with the user's own `hooks` in any order instead of replacing them. `Symbol.for`, so that every copy of
 * @oncely/core in a process (ESM and CommonJS) agrees on it.
 */
export const OBSERVERS: unique symbol = Symbol.for('oncely.observers') as never;

/** The two ways to observe, shared by the engine's, `idempotent()`'s and the broker wrappers' options. */
export interface ObservableOptions {
  /** Observation hooks. Default: none. */
  hooks?: IdempotencyHooks;
  /** Hooks added by add-ons such as `otel()` from @oncely/opentelemetry, run after `hooks`. Default: none. */
  [OBSERVERS]?: readonly IdempotencyHooks[];
}

/**
 * One hooks object running each given one in order (undefined entries skipped). Every hook runs even if an
 * earlier one threw; the first exception is re-thrown afterwards, so the caller logs it as usual.
 */
export function composeHooks(...list: (IdempotencyHooks | undefined)[]): IdempotencyHooks {
  const present = list.filter((h): h is IdempotencyHooks => h !== undefined);
  if (present.length === 1) return { ...present[0] };
  const names = new Set<keyof IdempotencyHooks>();
  for (const h of present) for (const name of Object.keys(h) as (keyof IdempotencyHooks)[]) names.add(name);
  const composed: Record<string, (event: unknown) => void> = {};
  for (const name of names) {
    const fns = present
      .map((h) => h[name] as ((event: unknown) => void) | undefined)
      .filter((f): f is (event: unknown) => void => typeof f === 'function');
    composed[name] =
      fns.length === 1
        ? (fns[0] as (event: unknown) => void)
        : (event) => {
            let failure: { error: unknown } | undefined;
            for (const fn of fns) {
              try {
                fn(event);
              } catch (error) {
                failure ??= { error };
              }
            }
            if (failure !== undefined) throw failure.error;
          };
  }
  return composed as IdempotencyHooks;
}

// Every hook there is (the compiler checks the list against IdempotencyHooks): read through the prototype chain
// too, so that a class instance's methods count.
const HOOK_NAMES = Object.keys({
  onMiss: true,
  onHit: true,
  onConflict: true,
  onMismatch: true,
  onComplete: true,
  onStep: true,
  onRelease: true,
  onUnconfirmedWrite: true,
  onStoreError: true,
  onFenced: true,
  onUnscopedCredentials: true,
  onDecision: true,
  onStoreOperation: true,
  onExecutionStart: true,
  onExecutionEnd: true,
} satisfies Record<keyof IdempotencyHooks, true>) as (keyof IdempotencyHooks)[];

/**
 * Validates a hooks object (each value a function) and returns a copy. Of a class instance, the hooks are taken
 * (its own or its prototype's, which a copy would leave behind), bound to it so that `this` is still the instance.
 */
export function checkHooks(value: unknown, name = 'hooks'): IdempotencyHooks {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new IdempotencyOptionsError(name, 'must be an object of callbacks such as { onHit(event) {} }.');
  }
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) {
    for (const [hookName, hook] of Object.entries(value)) {
      if (typeof hook !== 'function')
        throw new IdempotencyOptionsError(`${name}.${hookName}`, 'must be a function.');
    }
    return { ...(value as IdempotencyHooks) };
  }
  // A class instance: its state is its own business; only the hooks, its own or its prototype's, are taken.
  const copy: Record<string, unknown> = {};
  for (const hookName of HOOK_NAMES) {
    const hook: unknown = (value as Record<string, unknown>)[hookName];
    if (hook === undefined) continue;
    if (typeof hook !== 'function')
      throw new IdempotencyOptionsError(`${name}.${hookName}`, 'must be a function.');
    copy[hookName] = (hook as (event: unknown) => void).bind(value);
  }
  return copy as IdempotencyHooks;
}

/**
 * The hooks of an options object: its `hooks`, then each of its `[OBSERVERS]`, composed. `undefined` when it sets
 * neither (so a route can inherit its plugin's).
 */
export function hooksOf(options: ObservableOptions): IdempotencyHooks | undefined {
  return hooksOver(options, undefined);
}

// The two parts each composed hooks object was made of, so that options over it (a route's over its plugin's)
// replace only the part they set: a route's `hooks` keep the plugin's otel(), a route's otel() the plugin's hooks.
const parts = new WeakMap<
  IdempotencyHooks,
  { own: IdempotencyHooks | undefined; observers: readonly IdempotencyHooks[] }
>();

/**
 * The hooks of `options` over `base` (what `hooksOf` gave the options they override): `hooks` replaces the base's
 * own hooks and `[OBSERVERS]` the base's observers, each only when set. `base` itself when neither is set.
 */
export function hooksOver(
  options: ObservableOptions,
  base: IdempotencyHooks | undefined,
): IdempotencyHooks | undefined {
  const own = options.hooks === undefined ? undefined : checkHooks(options.hooks);
  const added = options[OBSERVERS];
  if (added !== undefined && !Array.isArray(added)) {
    throw new IdempotencyOptionsError(
      'observers',
      'must be an array of hooks objects; spread what otel() returns: { ...options, ...otel() }.',
    );
  }
  const observers = added?.map((h: unknown) => checkHooks(h, 'observers[]'));
  if (own === undefined && observers === undefined) return base;
  const inherited = base === undefined ? undefined : (parts.get(base) ?? { own: base, observers: [] });
  const made = { own: own ?? inherited?.own, observers: observers ?? inherited?.observers ?? [] };
  const hooks = composeHooks(made.own, ...made.observers);
  parts.set(hooks, made);
  return hooks;
}

/**
 * The store as the engine (or `idempotent()`) should call it: `store` itself when `onStoreOperation` is not set
 * (no wrapper, no clock: the hot path pays nothing), else a wrapper timing `acquire`, `complete`, `release`,
 * `renew`, `recordStep` when the store has it (and `acquireInTransaction` as `acquire`, its transaction's `commit` as
 * `complete` and `rollback` as `release`) and reporting each to `emit`. Other methods are the store's own.
 */
export function observedStore<S extends IdempotencyStore>(
  store: S,
  adapter: AdapterKind,
  hooks: IdempotencyHooks,
  emit: (event: StoreOperationEvent) => void,
): S {
  if (hooks.onStoreOperation === undefined) return store;
  const kind = storeKind(store);
  // One async function per operation rather than a generic timing helper with a callback: no closure allocated per
  // call, which the engine's micro-benchmark measured (docs/benchmarks.md, "Measurements behind the code").
  const report: Report = (operation, key, start, error) =>
    emit(
      error === NO_ERROR
        ? { adapter, operation, result: 'ok', durationMs: performance.now() - start, store: kind, key }
        : {
            adapter,
            operation,
            result: 'error',
            durationMs: performance.now() - start,
            store: kind,
            key,
            errorType: errorTypeOf(error),
          },
    );
  const s = store as IdempotencyStore & { acquireInTransaction?: (...args: never[]) => Promise<unknown> };
  const wrapped: IdempotencyStore & Record<string, unknown> = {
    async acquire(key, options) {
      const start = performance.now();
      try {
        const result = await s.acquire(key, options);
        report('acquire', key, start, NO_ERROR);
        return result;
      } catch (error) {
        report('acquire', key, start, error);
        throw error;
      }
    },
    async complete(key, token, response, ttlMs) {
      const start = performance.now();
      try {
        const result = await s.complete(key, token, response, ttlMs);
        report('complete', key, start, NO_ERROR);
        return result;
      } catch (error) {
        report('complete', key, start, error);
        throw error;
      }
    },
    async release(key, token) {
      const start = performance.now();
      try {
        const result = await s.release(key, token);
        report('release', key, start, NO_ERROR);
        return result;
      } catch (error) {
        report('release', key, start, error);
        throw error;
      }
    },
    async renew(key, token, lockTimeoutMs) {
      const start = performance.now();
      try {
        const result = await s.renew(key, token, lockTimeoutMs);
        report('renew', key, start, NO_ERROR);
        return result;
      } catch (error) {
        report('renew', key, start, error);
        throw error;
      }
    },
  };
  if (typeof s.acquireInTransaction === 'function') {
    const acquireInTransaction = s.acquireInTransaction.bind(s) as (
      key: string,
      o: unknown,
    ) => Promise<unknown>;
    wrapped.acquireInTransaction = async (key: string, options: unknown) => {
      const start = performance.now();
      let result: unknown;
      try {
        result = await acquireInTransaction(key, options);
      } catch (error) {
        report('acquire', key, start, error);
        throw error;
      }
      report('acquire', key, start, NO_ERROR);
      const transaction = (result as { transaction?: StoreTransaction } | null)?.transaction;
      // In transactional mode the commit stores the response and the rollback frees the key: they are this mode's
      // complete and release, timed as such.
      return transaction === undefined || transaction === null
        ? result
        : { ...(result as object), transaction: observedTransaction(transaction, key, report) };
    };
  }
  if (typeof s.recordStep === 'function') {
    // Only on a store that has it: a store without recordStep must still look like one (step() refuses it).
    const recordStep = s.recordStep.bind(s);
    wrapped.recordStep = async (key: string, token: string, name: string, value: string, ttlMs: number) => {
      const start = performance.now();
      try {
        const result = await recordStep(key, token, name, value, ttlMs);
        report('recordStep', key, start, NO_ERROR);
        return result;
      } catch (error) {
        report('recordStep', key, start, error);
        throw error;
      }
    };
  }
  for (const name of ['get', 'delete', 'waitFor', 'close'] as const) {
    const method = s[name] as ((...args: unknown[]) => unknown) | undefined;
    if (typeof method === 'function') (wrapped as Record<string, unknown>)[name] = method.bind(s);
  }
  originals.set(wrapped, store);
  return wrapped as unknown as S;
}

/** The store each timing wrapper stands for, so that a message naming the store names the user's. */
const originals = new WeakMap<object, IdempotencyStore>();

/** The store as the user gave it: `store` itself, or the one a wrapper of `observedStore` times. */
export function originalStore(store: IdempotencyStore): IdempotencyStore {
  return originals.get(store) ?? store;
}

/** The transaction as the engine calls it: `commit` timed as `complete`, `rollback` as `release`. */
function observedTransaction(t: StoreTransaction, key: string, report: Report): StoreTransaction {
  return {
    get db() {
      return t.db;
    },
    async commit(response, ttlMs) {
      const start = performance.now();
      try {
        const committed = await t.commit(response, ttlMs);
        report('complete', key, start, NO_ERROR);
        return committed;
      } catch (error) {
        report('complete', key, start, error);
        throw error;
      }
    },
    async rollback() {
      const start = performance.now();
      try {
        await t.rollback();
        report('release', key, start, NO_ERROR);
      } catch (error) {
        report('release', key, start, error);
        throw error;
      }
    },
  };
}

/** What a timed operation's `report` is told: `NO_ERROR`, or what the store threw. */
type Report = (operation: StoreOperation, key: string, start: number, error: unknown) => void;
const NO_ERROR: unique symbol = Symbol('no error');

/** The `errorType` of a failed store operation: the thrown value's class name, or `'_OTHER'`. */
function errorTypeOf(error: unknown): string {
  if (typeof error !== 'object' || error === null) return '_OTHER'; // a thrown string has no class of its own
  try {
    // The class, read from the prototype: an own `constructor` property (a thrown parsed JSON object) is data.
    const prototype = Object.getPrototypeOf(error) as { constructor?: { name?: unknown } } | null;
    const name = prototype?.constructor?.name;
    return typeof name === 'string' && name !== 'Object' && CLASS_NAME.test(name) ? name : '_OTHER';
  } catch {
    // A Proxy or a getter that throws: the store's own error must still be reported, and rethrown as it was.
    return '_OTHER';
  }
}
const CLASS_NAME = /^[A-Za-z][A-Za-z0-9_]{0,63}$/;

/** A bounded label for a store: its class name, or `'custom'` (a plain object, an odd name). */
export function storeKind(store: object): string {
  const name = (store.constructor as { name?: unknown } | undefined)?.name;
  return typeof name === 'string' && name !== 'Object' && CLASS_NAME.test(name) ? name : 'custom';
}
