import type { Logger } from './logger';
import { tellHookThrew, type WarningCode } from './warnings';

// What the hooks are told, and the one place that calls them: the HTTP engine, idempotent() and the consumer
// runtime all report through a HookRunner, so a hook that throws is handled the same way everywhere.

/** Which side of oncely made a decision: an HTTP adapter (the engine) or `idempotent()` and the broker wrappers. */
export type AdapterKind = 'http' | 'consumer';

/** A store operation timed by `onStoreOperation`. */
export type StoreOperation = 'acquire' | 'complete' | 'release' | 'renew' | 'recordStep';

/**
 * The decision made for one request or message, once, when it is final (after a wait, if any):
 * `executed` the handler runs; `replayed` a stored response/result is returned; `conflict` the key is held by a
 * running request (409/429, or a consumer's delay); `mismatch` the key was reused with another fingerprint (422);
 * `rejected` the key is missing (and required) or malformed (400; a consumer dead-letters); `store_error` the store
 * failed at acquire (503, or fail-open execution; a consumer's delay).
 */
export type DecisionOutcome = 'executed' | 'replayed' | 'conflict' | 'mismatch' | 'rejected' | 'store_error';

/** The payload of `onDecision`: the final decision for one request or message. */
export interface DecisionEvent {
  /** Who decided: the engine (`'http'`) or `idempotent()` and the broker wrappers (`'consumer'`). */
  adapter: AdapterKind;
  /** What was decided. */
  outcome: DecisionOutcome;
  /** The store key (scope included), when there is one (not for a missing or malformed key). */
  key?: string;
  /** Set when the request waited in wait mode (`inProgress: { wait }`) before this decision: how long, in ms. */
  waitedMs?: number;
}

/** The payload of `onStoreOperation`: one store call and how long it took. */
export interface StoreOperationEvent {
  /** Who called the store: the engine (`'http'`) or `idempotent()` and the broker wrappers (`'consumer'`). */
  adapter: AdapterKind;
  /** Which store operation it was. */
  operation: StoreOperation;
  /** `'ok'`: the store answered; `'error'`: it threw or timed out. */
  result: 'ok' | 'error';
  /** Wall time of the store call, in ms (fractional). */
  durationMs: number;
  /** The store's class name (`MemoryStore`, `RedisStore`), or `'custom'` for an object store. */
  store: string;
  /** The store key (scope included). */
  key: string;
  /**
   * When `result` is `'error'`: the class name of what the store threw (`ReplyError`, `TimeoutError`), or `'_OTHER'`
   * when it has none that reads as one (OpenTelemetry's `error.type` convention: bounded by the code, not the data).
   */
  errorType?: string;
}

/**
 * How a write the store could not confirm in time ended (`onUnconfirmedWrite`): `'confirmed'` (a re-sent write was
 * confirmed), `'lost'` (the key is no longer this execution's), `'expired'` (a completion's TTL ran out before it was
 * confirmed: a retry would run again by then anyway), `'gave_up'` (the store stopped re-sending: its bound ran out,
 * or it was closed).
 */
export type UnconfirmedWriteOutcome = 'confirmed' | 'lost' | 'expired' | 'gave_up';

/** An execution (a handler or consumer function running under a key, or unprotected in fail-open) began or ended. */
export interface ExecutionEvent {
  /** Who runs it: the engine (`'http'`) or `idempotent()` and the broker wrappers (`'consumer'`). */
  adapter: AdapterKind;
  /** The store key (scope included). */
  key: string;
}

/** Payloads of the observation hooks. `key` is the store key (scope included). */
export interface IdempotencyEvent {
  /** The store key (scope included). */
  key: string;
}
/** The payload of `onConflict`: the key is held by a running request or call. */
export interface ConflictEvent extends IdempotencyEvent {
  /** Time left on the holder's lease, in ms. */
  retryAfterMs: number;
}
/** The payload of `onStoreError`: a store operation failed. */
export interface StoreErrorEvent {
  /** The store key (scope included), when the operation had one. */
  key?: string;
  /** The operation that failed. */
  operation: StoreOperation;
  /** What the store threw. */
  error: unknown;
}
/** The payload of `onFenced`: the store refused a write because the key is no longer this execution's. */
export interface FencedEvent extends IdempotencyEvent {
  /** The write the store refused: `'recordStep'` is a step's (`step()` then rejects with `StepError` `'lease-lost'`). */
  operation: 'complete' | 'release' | 'renew' | 'recordStep';
  /** Who reported it: the engine (`'http'`) or `idempotent()` (`'consumer'`). */
  adapter?: AdapterKind;
}
/** The payload of `onRelease`: a key was released without storing a response, so a retry runs again. */
export interface ReleaseEvent extends IdempotencyEvent {
  /** Who reported it: the engine (`'http'`) or `idempotent()` (`'consumer'`). */
  adapter?: AdapterKind;
  /**
   * Why the key was released: `'not-cacheable'` (the status is not one `cacheable` keeps; `status` says which),
   * `'error'` (the handler or function threw, or the framework routed an error), `'client-gone'` (HTTP only: the
   * client left while the store was asked, so the handler did not run).
   */
  reason: 'not-cacheable' | 'error' | 'client-gone';
  /** With `'not-cacheable'`: the response status. */
  status?: number;
}
/** The payload of `onComplete`: a response or result was stored under the key. */
export interface CompleteEvent extends IdempotencyEvent {
  /** The stored response's status (`200` for a result of `idempotent()`). */
  status: number;
}
/**
 * A write the store made but could not confirm in time, and how it ended (RedisStore's `waitForReplicas`: fewer
 * replicas than asked confirmed a completion or a release; the store re-sends it in the background).
 */
export interface UnconfirmedWriteEvent extends IdempotencyEvent {
  /** Who reported it: the engine (`'http'`) or `idempotent()` (`'consumer'`). */
  adapter: AdapterKind;
  /** The write left unconfirmed: a completion or a release. */
  operation: 'complete' | 'release';
  /**
   * `'unconfirmed'` once, when the write is left unconfirmed (the response is sent all the same); then once, how it
   * ended: `'confirmed'` (a re-sent write was confirmed), `'lost'` (the key is no longer this execution's: its lease
   * ended or another request took the key, so for a completion a retry runs again; for a release, nothing is left
   * to release), `'expired'` (a completion's `ttl`, counted from its first write, ran out before it was confirmed: a
   * retry would run again by then anyway), `'gave_up'` (the store stopped re-sending: its bound ran out, or it was
   * closed).
   */
  outcome: 'unconfirmed' | UnconfirmedWriteOutcome;
}

/**
 * A step of an execution (`step(name, fn)`) finished: `'run'` its function ran and its result was recorded;
 * `'replayed'` an earlier attempt of the key had recorded it, so its recorded result was returned without running.
 */
export interface StepEvent extends IdempotencyEvent {
  /** Who runs the execution: the engine (`'http'`) or `idempotent()` and the broker wrappers (`'consumer'`). */
  adapter: AdapterKind;
  /** The step's name, as the code gave it (bounded by the code, not by the data). */
  name: string;
  /** `'run'`: the function ran and its result was recorded; `'replayed'`: a recorded result was returned. */
  outcome: 'run' | 'replayed';
}

/** A covered request carried credentials while the engine has no `scope` (reported once per engine). */
export interface UnscopedCredentialsEvent {
  /** The credential header seen: `'authorization'` or `'cookie'`. Its value is never passed. */
  header: 'authorization' | 'cookie';
}

/**
 * Callbacks to observe what the engine decides. They run synchronously on the request path: keep them cheap.
 * An exception thrown by a hook is logged and swallowed; it never changes the answer.
 */
export interface IdempotencyHooks {
  /** A completed record was replayed. */
  onHit?(event: IdempotencyEvent): void;
  /** No live record: this request acquired the key and runs the handler. */
  onMiss?(event: IdempotencyEvent): void;
  /** The key is held by a request still running: 409/429 (or a wait). */
  onConflict?(event: ConflictEvent): void;
  /** The key was reused with a different request fingerprint: 422. */
  onMismatch?(event: IdempotencyEvent): void;
  /** The store failed or timed out. */
  onStoreError?(event: StoreErrorEvent): void;
  /** The store refused an operation because this request's lease had expired and its token no longer owns the key. */
  onFenced?(event: FencedEvent): void;
  /** The handler's response was stored. */
  onComplete?(event: CompleteEvent): void;
  /** A step ran and was recorded, or was replayed from an earlier attempt's record (`step(name, fn)`). */
  onStep?(event: StepEvent): void;
  /** The key was released so the next request runs the handler again. */
  onRelease?(event: ReleaseEvent): void;
  /**
   * A completion or release the store wrote but could not confirm in time (`outcome: 'unconfirmed'`), then how it
   * ended: two events per such write. Only stores that confirm writes report it (RedisStore with `waitForReplicas`).
   */
  onUnconfirmedWrite?(event: UnconfirmedWriteEvent): void;
  /**
   * A covered request carried `Authorization` or `Cookie` and no `scope` is set: any client sending the same key
   * would get this caller's stored response (docs/security.md). Called once per engine, beside a logged warning;
   * never with `scope` set or `scope: false`.
   */
  onUnscopedCredentials?(event: UnscopedCredentialsEvent): void;
  /**
   * The final decision for a request or message, once (after a wait, if any), with how long it waited. One event
   * per decision, so counting them counts requests; `onHit`, `onConflict` and the others say the same more finely.
   */
  onDecision?(event: DecisionEvent): void;
  /** A store operation finished (or failed), with its duration. Setting this hook is what turns timing on. */
  onStoreOperation?(event: StoreOperationEvent): void;
  /** A handler (or consumer function) started running under a key; `onExecutionEnd` follows exactly once. */
  onExecutionStart?(event: ExecutionEvent): void;
  /** The execution `onExecutionStart` announced was settled: completed, released, failed, or given up. */
  onExecutionEnd?(event: ExecutionEvent): void;
}

/** The event a hook named `K` receives. */
export type HookEvent<K extends keyof IdempotencyHooks> = Parameters<NonNullable<IdempotencyHooks[K]>>[0];

/**
 * Calls the hooks of one engine or wrapped function. A hook that throws never changes the answer: the throw is
 * logged (or said once as a process warning, per `warned`) and swallowed. Made once per engine or wrapper, so the
 * request path allocates nothing for it.
 */
export class HookRunner {
  readonly hooks: IdempotencyHooks;
  readonly adapter: AdapterKind;
  readonly #warned: Set<WarningCode>;

  constructor(hooks: IdempotencyHooks, adapter: AdapterKind, warned: Set<WarningCode>) {
    this.hooks = hooks;
    this.adapter = adapter;
    this.#warned = warned;
  }

  /** Runs hook `name` if it is set, never letting it break a request or a call. */
  run<K extends keyof IdempotencyHooks>(name: K, event: HookEvent<K>, log: Logger): void {
    const hook = this.hooks[name] as ((e: HookEvent<K>) => void) | undefined;
    if (hook === undefined) return;
    try {
      // Called as a method of the hooks object: a plain-object hook may use `this`, as it always could.
      hook.call(this.hooks, event);
    } catch (error) {
      tellHookThrew(log, name, error, this.#warned);
    }
  }

  /** Reports an execution begun under `key` to `onExecutionStart`; no event is made when it is not set. */
  executionStarted(key: string, log: Logger): void {
    if (this.hooks.onExecutionStart !== undefined)
      this.run('onExecutionStart', { adapter: this.adapter, key }, log);
  }

  /** Reports the end of the execution `executionStarted` announced to `onExecutionEnd`. */
  executionEnded(key: string, log: Logger): void {
    if (this.hooks.onExecutionEnd !== undefined)
      this.run('onExecutionEnd', { adapter: this.adapter, key }, log);
  }

  /** Reports a final decision to `onDecision`; nothing to do (no clock, no event) when it is not set. */
  decided(
    outcome: DecisionOutcome,
    key: string | undefined,
    waitStart: number | undefined,
    log: Logger,
  ): void {
    if (this.hooks.onDecision === undefined) return;
    const event: DecisionEvent =
      key === undefined ? { adapter: this.adapter, outcome } : { adapter: this.adapter, outcome, key };
    if (waitStart !== undefined) event.waitedMs = Date.now() - waitStart;
    this.run('onDecision', event, log);
  }
}
