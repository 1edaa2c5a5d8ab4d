import { createHash } from 'node:crypto';
import { IdempotencyReplayError, IdempotencyStoreError } from '../consumer/errors';
import { jsonText } from '../consumer/result-codec';
import type { RecordedSteps } from '../stores/store';
import { hasLoneSurrogate } from './checks';
import type { IdempotencyContext, StepResult } from './context';
import { StepError } from './errors';
import type { Logger } from './logger';
import { originalStore } from './observe';
import type { KeyProtocol } from './protocol';

/**
 * The key `keyFor(name)` gives under the store key `key` (scope included): base64url of the SHA-256 of the UTF-8
 * JSON text `["oncely.keyFor.v1", key, name]`. Documented in docs/steps.md; never change it, or a retry after an
 * upgrade would send a downstream service a new key.
 */
export function derivedKey(key: string, name: string): string {
  return createHash('sha256')
    .update(JSON.stringify(['oncely.keyFor.v1', key, name]))
    .digest('base64url');
}

/** The longest step name, in UTF-16 code units: names are chosen by code, and a store keeps each with its value. */
const MAX_NAME_LENGTH = 200;

function noop(): void {}

/**
 * What every step of one engine or wrapper shares, made once per engine or wrapper so that an execution pays
 * nothing for it: the protocol (the store as observed, the hooks), the record's `ttl` and the size limit.
 */
export interface StepSettings {
  readonly protocol: KeyProtocol;
  readonly ttlMs: number;
  readonly maxBytes: number;
  /** The limit as an error message names it: `'maxResultBytes (1048576)'`. */
  readonly limit: string;
}

/**
 * The settings of one engine's or wrapper's steps. `maxResultBytes`: idempotent()'s option of that name (and the
 * consumers' through it); without it (HTTP, a transaction) steps get its default, 1 MiB of JSON text.
 */
export function stepSettings(protocol: KeyProtocol, ttlMs: number, maxResultBytes?: number): StepSettings {
  return maxResultBytes === undefined
    ? { protocol, ttlMs, maxBytes: 1_048_576, limit: 'the 1048576 bytes a step may record' }
    : { protocol, ttlMs, maxBytes: maxResultBytes, limit: `maxResultBytes (${maxResultBytes})` };
}

/**
 * The context of one execution under a key: `step()` and `keyFor()` over its store key and token. Made per
 * execution, so it holds no step state until the first `step()`: an execution that never calls it allocates no set.
 *
 * Steps are recorded in the store when a token is given (a lease-held execution); without one (fail-open, or a
 * transaction whose writes commit or roll back together with its record) they run and are only checked for their
 * name and result, since nothing recorded outside the transaction could be trusted.
 */
export class ExecutionContext implements IdempotencyContext {
  readonly key: string;
  readonly db: unknown;
  /** The store key (scope included), which `keyFor` derives from and steps are recorded under. */
  readonly #storeKey: string;
  readonly #settings: StepSettings;
  /** The lease's token when steps are recorded in the store; `undefined` when they are kept in memory only. */
  readonly #token: string | undefined;
  /** What an earlier attempt of the key recorded, to replay. */
  readonly #resumed: RecordedSteps | undefined;
  readonly #log: Logger;
  /** The names used in this attempt: made at the first step. */
  #used: Set<string> | undefined;
  /** The steps whose function or recording is still running: made at the first step that runs its function. */
  #running: Set<Promise<unknown>> | undefined;
  /** The store refused a step: the key is no longer this execution's. */
  #lost = false;
  #finished = false;

  constructor(
    storeKey: string,
    clientKey: string,
    db: unknown,
    settings: StepSettings,
    log: Logger,
    token?: string,
    resumed?: RecordedSteps,
  ) {
    this.#storeKey = storeKey;
    this.key = clientKey;
    this.db = db;
    this.#settings = settings;
    this.#token = token;
    this.#resumed = resumed;
    this.#log = log;
  }

  /**
   * @internal The execution settled (completed, released, given up): every later `step()` rejects, and a step still
   * running when it settled is not recorded. A static method, so the handler's context shows no such member.
   */
  static finish(context: ExecutionContext): void {
    context.#finished = true;
  }

  /**
   * @internal The execution is about to give its key back (released, rolled back): wait for the steps still
   * running to finish and be recorded, at most the lease's `lockTimeout` (the caller keeps renewing it meanwhile),
   * then finish. Without the wait, a step that outlived a sibling's failure under `Promise.all` would be refused
   * once the key was free, and the retry would run it again.
   */
  static async finishAfterSteps(context: ExecutionContext): Promise<void> {
    const running = context.#running;
    if (running !== undefined && running.size > 0 && !context.#finished) {
      let timer: NodeJS.Timeout | undefined;
      const deadline = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, context.#settings.protocol.lockTimeoutMs);
        timer.unref();
      });
      let timedOut = false;
      void deadline.then(() => {
        timedOut = true;
      });
      // A step may start another while the wait lasts: wait until none is left.
      while (running.size > 0 && !timedOut) await Promise.race([deadline, ...running]);
      clearTimeout(timer);
    }
    context.#finished = true;
  }

  keyFor(name: string): string {
    return derivedKey(this.#storeKey, name);
  }

  async step<T>(name: string, fn: () => unknown): Promise<StepResult<T>> {
    this.#checkName(name);
    if (this.#finished) throw this.#finishedError(name);
    this.#used ??= new Set();
    const used = this.#used;
    if (used.has(name)) {
      throw new StepError(
        'duplicate-name',
        name,
        `step ${JSON.stringify(name)} was already used in this attempt of key ${JSON.stringify(this.key)}; its function did not run again. Give each step its own name (in a loop, put the index in the name).`,
      );
    }
    used.add(name);
    if (this.#lost) throw this.#lostError(name);
    const settings = this.#settings;
    const resumed = this.#resumed;
    if (resumed !== undefined && Object.hasOwn(resumed, name)) {
      const value = this.#decode(name, resumed[name] as string);
      this.#report(name, 'replayed');
      return value as StepResult<T>;
    }
    const token = this.#token;
    const store = settings.protocol.store;
    if (token !== undefined && typeof store.recordStep !== 'function') {
      const storeName = (originalStore(store).constructor as { name?: unknown } | undefined)?.name;
      throw new StepError(
        'unsupported-store',
        name,
        `step ${JSON.stringify(name)}: the store ${typeof storeName === 'string' && storeName !== '' ? storeName : '(unnamed)'} cannot record steps (it has no recordStep()); its function did not run. Use a store that records steps, such as MemoryStore, RedisStore, PostgresStore or DynamoDBStore, or call the function without step().`,
      );
    }
    this.#running ??= new Set();
    const running = this.#running;
    const run = this.#run(name, fn, token);
    const settled = run.then(noop, noop);
    running.add(settled);
    try {
      return (await run) as StepResult<T>;
    } finally {
      running.delete(settled);
    }
  }

  /** Runs a step's function and records its result: what `finishAfterSteps` waits for. */
  async #run(name: string, fn: () => unknown, token: string | undefined): Promise<unknown> {
    const result = await fn();
    if (this.#finished) throw this.#finishedError(name);
    const text = this.#encode(name, result);
    if (token !== undefined) await this.#record(name, token, text);
    this.#report(name, 'run');
    return text === '' ? undefined : JSON.parse(text);
  }

  #checkName(name: unknown): void {
    if (
      typeof name !== 'string' ||
      name.length === 0 ||
      name.length > MAX_NAME_LENGTH ||
      hasLoneSurrogate(name) ||
      // PostgreSQL's text and jsonb cannot hold U+0000: such a step would never be recorded there.
      name.includes('\u0000')
    ) {
      const shown =
        typeof name === 'string'
          ? name.length > 40
            ? `a string of ${name.length} characters`
            : JSON.stringify(name)
          : typeof name;
      throw new StepError(
        'invalid-name',
        typeof name === 'string' ? name : String(name),
        `a step name must be a non-empty string of at most ${MAX_NAME_LENGTH} characters in well-formed Unicode (no lone surrogate, no U+0000); got ${shown}. The step's function did not run.`,
      );
    }
  }

  /** The JSON text recorded for `value` (`''` for `undefined`); `StepError` `'unstorable'` when there is none. */
  #encode(name: string, value: unknown): string {
    if (value === undefined) return '';
    const { maxBytes, limit } = this.#settings;
    const text = jsonText(value);
    let reason: string;
    let cause: unknown;
    if ('json' in text) {
      // Cheap bound first: a UTF-8 byte is at least one UTF-16 unit, at most three per unit.
      const bytes = text.json.length * 3 <= maxBytes ? 0 : Buffer.byteLength(text.json);
      if (bytes <= maxBytes) return text.json;
      reason = `the result is ${bytes} bytes of JSON, more than ${limit}`;
    } else {
      reason = text.reason;
      cause = text.cause;
    }
    throw new StepError(
      'unstorable',
      name,
      `step ${JSON.stringify(name)} ran, but its result cannot be recorded: ${reason}. Nothing was recorded, so a retry runs it again; return a JSON value (or nothing), keeping what the caller needs small.`,
      cause === undefined ? undefined : { cause },
    );
  }

  #decode(name: string, text: string): unknown {
    if (text === '') return undefined;
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new IdempotencyReplayError(
        this.#storeKey,
        `the recorded result of step ${JSON.stringify(name)} is not JSON.`,
        {
          cause: error,
        },
      );
    }
  }

  async #record(name: string, token: string, text: string): Promise<void> {
    if (this.#lost) throw this.#lostError(name);
    const { protocol, ttlMs } = this.#settings;
    const key = this.#storeKey;
    const log = this.#log;
    let recorded: boolean;
    try {
      recorded = await (protocol.store.recordStep as NonNullable<typeof protocol.store.recordStep>)(
        key,
        token,
        name,
        text,
        ttlMs,
      );
    } catch (error) {
      protocol.hooks.run('onStoreError', { key, operation: 'recordStep', error }, log);
      log.error(
        { err: error, key, step: name },
        'oncely: could not record a step; it ran, and a retry runs it again',
      );
      throw new IdempotencyStoreError(key, 'recordStep', { cause: error, step: name });
    }
    if (!recorded) {
      this.#lost = true;
      protocol.fenced(key, 'recordStep', log);
      throw this.#lostError(name);
    }
  }

  #report(name: string, outcome: 'run' | 'replayed'): void {
    const hooks = this.#settings.protocol.hooks;
    if (hooks.hooks.onStep !== undefined)
      hooks.run('onStep', { adapter: hooks.adapter, key: this.#storeKey, name, outcome }, this.#log);
  }

  #lostError(name: string): StepError {
    return new StepError(
      'lease-lost',
      name,
      `step ${JSON.stringify(name)} was not recorded: this execution no longer owns key ${JSON.stringify(this.key)} (its lease ran out unrenewed, and another attempt may have taken the key over). Stop: the key's work is that attempt's now.`,
    );
  }

  #finishedError(name: string): StepError {
    return new StepError(
      'finished',
      name,
      `step ${JSON.stringify(name)} was called after the execution of key ${JSON.stringify(this.key)} was settled (its response sent, or its function returned), so it was not recorded. Await every step before answering.`,
    );
  }
}
