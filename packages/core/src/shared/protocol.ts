import {
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyStoreError,
} from '../consumer/errors';
import type {
  AcquireResult,
  IdempotencyStore,
  InProgressResult,
  StoreTransaction,
  TransactionAcquiredResult,
  TransactionalIdempotencyStore,
} from '../stores/store';
import { asStoredFingerprint, hasLoneSurrogate } from './checks';
import { CommitOutcomeUnknownError, StoreOperationError } from './errors';
import type { AdapterKind, FencedEvent, HookRunner, ReleaseEvent } from './hooks';
import type { Logger } from './logger';
import { followConfirmation } from './observe';

// The key protocol that the HTTP engine and idempotent() (hence the consumer runtime and every broker wrapper)
// share: checking a key and a fingerprint, acquiring the key and waiting for it, then what a held key's lease renewal, completion and release do with
// each answer of the store, fencing included. Each side keeps its own `await` on the store and hands the answer
// here synchronously, so that the request path pays no extra promise for the shared code.

/** The log lines that differ between the sides: one speaks of requests and handlers, the other of calls. */
interface ProtocolTexts {
  fenced: string;
  /** A completion the store wrote but could not make durable (`recordWritten` on its error). */
  written(what: string): string;
  notStored(what: string): string;
  notReleased: string;
  notCommitted: string;
  commitUnknown: string;
}

const TEXTS: Record<AdapterKind, ProtocolTexts> = {
  http: {
    fenced:
      'oncely: this request lost its lease (it ran longer than lockTimeout without a renewal); the store refused the write',
    written: (what) =>
      `oncely: ${what} was stored but its durability was not confirmed; a failover before it replicates would let a retry run the handler again`,
    notStored: (what) =>
      `oncely: could not store ${what}; a retry after the lease ends will run the handler again`,
    notReleased: 'oncely: could not release the key; it frees itself when its lease ends',
    notCommitted: 'oncely: the transaction did not commit; nothing the handler wrote was kept',
    commitUnknown:
      "oncely: the commit got no answer; whether the handler's writes were kept is unknown until a retry with this key (a replay if they were)",
  },
  consumer: {
    fenced:
      'oncely: this call lost its lease (it ran longer than lockTimeout without a renewal, so another call may have taken the key over); the store refused the write',
    written: (what) =>
      `oncely: ${what} was stored but its durability was not confirmed; a failover before it replicates would let a retry run the function again`,
    notStored: (what) =>
      `oncely: could not store ${what}; once the lease ends, a retry with this key runs the function again`,
    notReleased: 'oncely: could not release the key after a failure; it frees itself when its lease ends',
    notCommitted: 'oncely: the transaction did not commit; nothing the work wrote was kept',
    commitUnknown:
      "oncely: the commit got no answer; whether the work's writes were kept is unknown until a retry with this key (a replay if they were)",
  },
};

const notConfirmed = (what: string): string =>
  `oncely: the store could not confirm that its replicas have ${what} (not confirmed in time, or no reply); it re-sends it until they do`;

/**
 * Per-call settings of a lease, for a platform that knows more about one request or delivery than the options do:
 * Lambda's deadline, an SQS message's visibility to extend alongside. Adapters pass them in `HttpRequestInput.lease`
 * and `ConsumerRuntime.decide()`.
 */
export interface LeaseSettings {
  /**
   * A time (`Date.now()` milliseconds) the lease never runs past, by its acquire or any renewal: the invocation's
   * deadline plus a margin, so a retry after a timeout takes the key over instead of waiting out `lockTimeout`.
   * An acquire's lease is never under one second (`LEASE_FLOOR_MS`) for it. Not a number (NaN): no effect.
   */
  endsAt?: number;
  /**
   * Called after each renewal the store accepted, to extend something else with the lease (an SQS message's
   * visibility): one heartbeat for both. What it throws or rejects with is logged and ignored.
   */
  onRenewed?: () => unknown;
}

/**
 * The shortest lease `endsAt` can make an acquire write. A call that starts at or just before its deadline still
 * writes a lease a duplicate must wait out (a zero or negative one would let the duplicate run beside it at once,
 * and some stores refuse it), so an acquire's lease runs past `endsAt` by at most this much; renewals never do.
 */
export const LEASE_FLOOR_MS = 1000;

/**
 * One engine's or wrapped function's side of the key protocol: its store (as observed), its hooks and its lease
 * length. Made once per engine or wrapper; every method takes the request's or call's logger.
 */
export class KeyProtocol {
  readonly store: IdempotencyStore;
  readonly hooks: HookRunner;
  readonly lockTimeoutMs: number;
  readonly #texts: ProtocolTexts;

  constructor(store: IdempotencyStore, hooks: HookRunner, lockTimeoutMs: number) {
    this.store = store;
    this.hooks = hooks;
    this.lockTimeoutMs = lockTimeoutMs;
    this.#texts = TEXTS[hooks.adapter];
  }

  /**
   * Asks the store for the key (the caller awaits the store's own promise), for `lockTimeout` or until `endsAt`,
   * whichever comes first, but for at least `LEASE_FLOOR_MS` (or `lockTimeout`, if shorter).
   */
  acquire(key: string, fingerprint: string, endsAt?: number): Promise<AcquireResult> {
    let lockTimeoutMs = this.lockTimeoutMs;
    if (endsAt !== undefined) {
      // Whole milliseconds, as stores take them; NaN compares false, so it leaves lockTimeout.
      const left = Math.floor(endsAt - Date.now());
      if (left < lockTimeoutMs) lockTimeoutMs = Math.max(left, Math.min(LEASE_FLOOR_MS, lockTimeoutMs));
    }
    return this.store.acquire(key, { fingerprint, lockTimeoutMs });
  }

  /** `acquire` in a store transaction that the work's writes join (transactional mode). */
  acquireInTransaction(key: string, fingerprint: string): Promise<AcquireResult | TransactionAcquiredResult> {
    return (this.store as TransactionalIdempotencyStore).acquireInTransaction(key, {
      fingerprint,
      lockTimeoutMs: this.lockTimeoutMs,
    });
  }

  /**
   * Releases at once a key acquired only to find its record kept for another fingerprint (a resumed record whose
   * steps an earlier attempt left): the record stays released with its steps, as it was. In a transaction, rolls
   * it back (its connection and lock go with it; a release from another connection would wait on its row lock).
   * Never throws; only a failure is reported (the key frees itself when the new lease ends).
   */
  async giveBack(key: string, result: AcquireResult | TransactionAcquiredResult, log: Logger): Promise<void> {
    if (result.status !== 'acquired') return;
    if ('transaction' in result) {
      try {
        await result.transaction.rollback();
      } catch (error) {
        this.#rollbackFailed(key, error, log);
      }
      return;
    }
    try {
      await this.store.release(key, result.token);
    } catch (error) {
      this.releaseFailed(key, error, log);
    }
  }

  /** The acquire failed (or timed out): reported as a store error, and as the decision `store_error`. */
  acquireFailed(key: string, error: unknown, waitStart: number | undefined, log: Logger): void {
    this.hooks.run('onStoreError', { key, operation: 'acquire', error }, log);
    this.hooks.decided('store_error', key, waitStart, log);
  }

  /**
   * What a call or a message is told when its acquire's verdict runs nothing and replays nothing (the key is held,
   * reused with another fingerprint, or the store answered nonsense): the decision is reported and its error
   * returned, for the caller to throw.
   */
  refusal(
    verdict: 'in_progress' | 'mismatch' | 'unknown',
    key: string,
    result: AcquireResult,
    waitStart: number | undefined,
    log: Logger,
  ): Error {
    switch (verdict) {
      case 'in_progress':
        this.hooks.decided('conflict', key, waitStart, log);
        return new IdempotencyInProgressError(key, (result as InProgressResult).retryAfterMs);
      case 'mismatch':
        this.hooks.decided('mismatch', key, waitStart, log);
        return new IdempotencyMismatchError(key);
      default:
        // A store bug, not a decision: refuse rather than guess.
        this.hooks.decided('store_error', key, waitStart, log);
        return new IdempotencyStoreError(key, 'acquire', { cause: unknownStatusError(result) });
    }
  }

  /** The store's answer to a completion: stored, or refused because this token no longer owns the key. */
  completed(key: string, stored: boolean, status: number, log: Logger): void {
    if (stored) this.hooks.run('onComplete', { key, status }, log);
    else this.fenced(key, 'complete', log);
  }

  /**
   * The completion failed. A store may have written the record and failed only to make it durable, or go on
   * writing and confirming it in the background (RedisStore's waitForReplicas): each is reported as such.
   */
  completeFailed(key: string, error: unknown, what: string, log: Logger): void {
    this.hooks.run('onStoreError', { key, operation: 'complete', error }, log);
    const confirming = this.#followConfirmation(key, 'complete', error, log);
    log.error(
      { err: error, key },
      confirming
        ? notConfirmed(what)
        : (error as { recordWritten?: unknown } | null)?.recordWritten === true
          ? this.#texts.written(what)
          : this.#texts.notStored(what),
    );
  }

  /** The store's answer to a release: released, or refused because this token no longer owns the key. */
  released(
    key: string,
    released: boolean,
    reason: ReleaseEvent['reason'],
    status: number | undefined,
    log: Logger,
  ): void {
    if (!released) {
      this.fenced(key, 'release', log);
      return;
    }
    const adapter = this.hooks.adapter;
    this.hooks.run(
      'onRelease',
      status === undefined ? { adapter, key, reason } : { adapter, key, reason, status },
      log,
    );
  }

  /** The release failed: the key frees itself when its lease ends (or once the store confirms the release). */
  releaseFailed(key: string, error: unknown, log: Logger): void {
    this.hooks.run('onStoreError', { key, operation: 'release', error }, log);
    log.error(
      { err: error, key },
      this.#followConfirmation(key, 'release', error, log)
        ? notConfirmed('the release')
        : this.#texts.notReleased,
    );
  }

  /**
   * A transaction's commit (its completion) failed: nothing the work wrote was kept, or, for a
   * `CommitOutcomeUnknownError`, it may have been.
   */
  commitFailed(key: string, error: unknown, log: Logger): void {
    this.hooks.run('onStoreError', { key, operation: 'complete', error }, log);
    log.error(
      { err: error, key },
      error instanceof CommitOutcomeUnknownError ? this.#texts.commitUnknown : this.#texts.notCommitted,
    );
  }

  /**
   * Rolls a transaction back (its release: the record and the work's writes go) and reports it. Never throws: a
   * failed rollback is reported, and the database ends the transaction when the connection closes.
   */
  async rollBack(
    transaction: StoreTransaction,
    key: string,
    reason: ReleaseEvent['reason'],
    status: number | undefined,
    log: Logger,
  ): Promise<void> {
    try {
      await transaction.rollback();
      this.released(key, true, reason, status, log);
    } catch (error) {
      this.#rollbackFailed(key, error, log);
    }
  }

  #rollbackFailed(key: string, error: unknown, log: Logger): void {
    this.hooks.run('onStoreError', { key, operation: 'release', error }, log);
    log.error(
      { err: error, key },
      'oncely: rollback failed; the database ends the transaction when the connection closes',
    );
  }

  /** The store refused a write because this token no longer owns the key: its lease ran out unrenewed. */
  fenced(key: string, operation: FencedEvent['operation'], log: Logger): void {
    this.hooks.run('onFenced', { adapter: this.hooks.adapter, key, operation }, log);
    log.warn({ key, operation }, this.#texts.fenced);
  }

  /** Reports a write the store is still confirming to `onUnconfirmedWrite`, now and when it ends; false if not one. */
  #followConfirmation(key: string, operation: 'complete' | 'release', error: unknown, log: Logger): boolean {
    const hooks = this.hooks;
    return followConfirmation(
      error,
      { adapter: hooks.adapter, key, operation },
      (event) => hooks.run('onUnconfirmedWrite', event, log),
      log,
    );
  }
}

/**
 * Renews a held key's lease every third of `lockTimeout` until stopped: a renewal the store refuses is fenced
 * (and not tried again), one that fails is reported and tried again. With `endsAt`, each renewal asks for
 * `lockTimeout` or until `endsAt`, whichever comes first, and renewing ends at `endsAt`. `onRenewed` follows each
 * renewal the store accepted, unless the lease was stopped meanwhile.
 */
export class Lease {
  readonly #protocol: KeyProtocol;
  readonly #key: string;
  readonly #token: string;
  readonly #log: Logger;
  readonly #settings: LeaseSettings | undefined;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(protocol: KeyProtocol, key: string, token: string, log: Logger, settings?: LeaseSettings) {
    this.#protocol = protocol;
    this.#key = key;
    this.#token = token;
    this.#log = log;
    this.#settings = settings;
    this.#schedule();
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
  }

  /** Schedules the next renewal a third of `lockTimeout` after `sentAt`, when the previous renewal was sent. */
  #schedule(sentAt?: number): void {
    const interval = Math.floor(this.#protocol.lockTimeoutMs / 3);
    // Counted from when the previous call was sent, not from its answer: a slow store round trip then delays the
    // next renewal by nothing, instead of adding its whole length to the gap the lease must outlast.
    const delay = sentAt === undefined ? interval : interval - (Date.now() - sentAt);
    // The lease rides as the timer's argument rather than in a closure made per renewal.
    this.#timer = setTimeout(Lease.#renew, Math.max(1, delay), this);
    // A pending renewal must not keep a process alive on its own.
    this.#timer.unref();
  }

  static #renew(lease: Lease): void {
    lease.#timer = undefined;
    const protocol = lease.#protocol;
    let lockTimeoutMs = protocol.lockTimeoutMs;
    const endsAt = lease.#settings?.endsAt;
    if (endsAt !== undefined) {
      const left = Math.floor(endsAt - Date.now());
      // Past endsAt nothing is renewed: the lease ends there (or, acquired with the floor, soon after).
      if (left <= 0) return;
      if (left < lockTimeoutMs) lockTimeoutMs = left;
    }
    const sentAt = Date.now();
    protocol.store.renew(lease.#key, lease.#token, lockTimeoutMs).then(
      (renewed) => {
        if (lease.#stopped) return;
        if (!renewed) {
          protocol.fenced(lease.#key, 'renew', lease.#log);
          return;
        }
        lease.#schedule(sentAt);
        const onRenewed = lease.#settings?.onRenewed;
        if (onRenewed !== undefined) lease.#heartbeat(onRenewed);
      },
      (error: unknown) => {
        protocol.hooks.run('onStoreError', { key: lease.#key, operation: 'renew', error }, lease.#log);
        lease.#log.warn({ err: error, key: lease.#key }, 'oncely: lease renewal failed; retrying');
        if (!lease.#stopped) lease.#schedule(sentAt);
      },
    );
  }

  /** Calls `onRenewed`; what it throws or rejects with is logged, never an unhandled rejection. */
  #heartbeat(onRenewed: () => unknown): void {
    const key = this.#key;
    const log = this.#log;
    try {
      const returned = onRenewed();
      if (typeof (returned as PromiseLike<unknown> | null)?.then === 'function') {
        Promise.resolve(returned).catch((error: unknown) =>
          log.error({ err: error, key }, 'oncely: onRenewed rejected; ignored'),
        );
      }
    } catch (error) {
      log.error({ err: error, key }, 'oncely: onRenewed threw; ignored');
    }
  }
}

/**
 * What an answer of `acquire` means for the request or call that asked: a record under another fingerprint is a
 * `mismatch` whatever its state (`compare` false: fingerprints are not checked), a resumed one (`acquired` with the
 * steps and fingerprint an earlier attempt left) included, whose new token the caller then gives back
 * (`KeyProtocol.giveBack`); a status no store gives is `unknown`, a store bug to refuse rather than guess at.
 */
export type Verdict = 'acquired' | 'completed' | 'in_progress' | 'mismatch' | 'unknown';

export function verdictOf(result: AcquireResult, fingerprint: string, compare: boolean): Verdict {
  switch (result.status) {
    case 'acquired':
      return compare && result.fingerprint !== undefined && result.fingerprint !== fingerprint
        ? 'mismatch'
        : 'acquired';
    case 'completed':
    case 'in_progress':
      return compare && result.fingerprint !== fingerprint ? 'mismatch' : result.status;
    default:
      return 'unknown';
  }
}

/** The error an `unknown` verdict stands for, as the store's own failure. */
export function unknownStatusError(result: AcquireResult): Error {
  return new StoreOperationError(
    `store.acquire() resolved to an unknown status ${JSON.stringify((result as { status?: unknown }).status)}`,
  );
}

/**
 * A wait for a held key (`inProgress: { wait }`), begun at its first `in_progress` answer and made only then, so
 * that a request that does not wait allocates nothing for it.
 */
export class Wait {
  /** When the wait began, for the `onDecision` event's `waitedMs`. */
  readonly start: number;
  readonly #deadline: number;
  #polls = 0;

  constructor(waitMs: number) {
    this.start = Date.now();
    this.#deadline = this.start + waitMs;
  }

  /**
   * Sleeps until the record changes, the lease runs out, or the wait ends; false, without sleeping, when the wait
   * is over. A store wake-up is trusted for up to 5s at a time (the bound on a lost notification); without one,
   * polls with backoff (25ms doubling to 1.6s) rather than spin. Never rejects: a failed wake-up is a poll.
   */
  async next(store: IdempotencyStore, key: string, retryAfterMs: number): Promise<boolean> {
    // The first sleep is measured from the start, as the wait's deadline is.
    const now = this.#polls === 0 ? this.start : Date.now();
    if (now >= this.#deadline) return false;
    const slice = Math.min(this.#deadline - now, Math.max(retryAfterMs, 1));
    const poll = Math.min(slice, 25 * 2 ** Math.min(this.#polls, 6));
    if (store.waitFor) {
      try {
        await store.waitFor(key, Math.min(slice, 5000));
      } catch {
        // A wake-up that failed says nothing about the record: poll instead. The next acquire meets an outage of the
        // store itself as a store error, answered as any other.
        await sleep(poll);
      }
    } else await sleep(poll);
    this.#polls++;
    return true;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

const LONE_SURROGATE_KEY =
  'the key holds a lone surrogate (not well-formed Unicode): a store keeping UTF-8 would read it as another key. Nothing ran.';

/**
 * Checks the key of a call or a message: at most `maxKeyLength` characters, and read back from a UTF-8 store as
 * itself. Throws `IdempotencyKeyError` (nothing has run). An HTTP key is checked as a header instead (`parseKey`).
 */
export function checkKey(key: string, maxKeyLength: number): void {
  if (key.length > maxKeyLength) {
    throw new IdempotencyKeyError(
      `the key is ${key.length} characters long, more than maxKeyLength (${maxKeyLength}). Nothing ran.`,
    );
  }
  if (hasLoneSurrogate(key)) throw new IdempotencyKeyError(LONE_SURROGATE_KEY);
}

/**
 * The fingerprint `compute` gives for `args`, as a UTF-8 store keeps it. A throw or anything but a string is an
 * `IdempotencyKeyError` (nothing has run).
 */
export function fingerprintOf<Args extends unknown[]>(
  compute: (...args: Args) => unknown,
  args: Args,
): string {
  let fingerprint: unknown;
  try {
    fingerprint = asStoredFingerprint(compute(...args));
  } catch (error) {
    throw new IdempotencyKeyError('the fingerprint function threw; nothing ran.', { cause: error });
  }
  if (typeof fingerprint !== 'string') {
    throw new IdempotencyKeyError(
      `the fingerprint function must return a string; got ${typeof fingerprint}. Nothing ran.`,
    );
  }
  return fingerprint;
}
