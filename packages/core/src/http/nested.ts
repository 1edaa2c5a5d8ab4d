import type { StoredResponse } from '../stores/store';
import type { Idempotency } from './engine';
import type { IdempotencyOptions, ResolvedOptions } from './options';
import { PROBLEM_TYPES, problemResponse } from './problems';

/**
 * One `idempotency()` (or `withIdempotency()`, or plugin registration) as the adapters see it when two of them
 * cover one request: its engine, the options it sets itself, and where it was created, to name it in errors.
 */
export interface Registration<Req = unknown> {
  /** The engine made from the options, over an outer registration's. */
  readonly engine: Idempotency<Req>;
  /** The options as given (for an adapter that layers them over an outer registration's, `nestedEngine`). */
  readonly options: IdempotencyOptions<Req>;
  /** The names of the options given with a value; the others are inherited from an outer registration. */
  readonly set: ReadonlySet<string>;
  /** Where it was created (`file:line:column` of the call), or a description when that is unknown. */
  readonly site: string;
  /** Whether a conflict was already reported as a process warning (said once, when there is no logger). */
  warned: boolean;
}

/**
 * Describes a registration. `createdBy` is the adapter function the application called (`idempotency`), so that
 * the call site named is the application's line that called it.
 */
export function registrationOf<Req>(
  engine: Idempotency<Req>,
  options: IdempotencyOptions<Req>,
  createdBy: (...args: never[]) => unknown,
  label: string,
): Registration<Req> {
  const set = new Set<string>();
  for (const name of Object.keys(options))
    if ((options as Record<string, unknown>)[name] !== undefined) set.add(name);
  return { engine, options, set, site: `${label} created at ${callSite(createdBy)}`, warned: false };
}

const layered = new WeakMap<Registration<never>, WeakMap<Idempotency<never>, Idempotency<never>>>();

/**
 * The engine of `inner` where it is nested in a registration whose engine is `outer` (for adapters where the
 * registration nearest the route handles the request): `inner`'s options over `outer`'s, as a route's options are
 * over its plugin's. Made once per pair.
 */
export function nestedEngine<Req>(outer: Idempotency<Req>, inner: Registration<Req>): Idempotency<Req> {
  let byOuter = layered.get(inner as Registration<never>);
  if (byOuter === undefined) {
    byOuter = new WeakMap();
    layered.set(inner as Registration<never>, byOuter);
  }
  let engine = byOuter.get(outer as Idempotency<never>) as Idempotency<Req> | undefined;
  if (engine === undefined) {
    engine = outer.with(inner.options);
    byOuter.set(outer as Idempotency<never>, engine as Idempotency<never>);
  }
  return engine;
}

/** The first stack frame above `createdBy`, or `an unknown place` where the runtime gives none. */
function callSite(createdBy: (...args: never[]) => unknown): string {
  const holder: { stack?: string } = {};
  if (typeof Error.captureStackTrace === 'function') Error.captureStackTrace(holder, createdBy);
  else holder.stack = new Error().stack;
  const frame = holder.stack
    ?.split('\n')
    .find((line) => line.trimStart().startsWith('at '))
    ?.trim()
    .slice(3);
  return frame ?? 'an unknown place';
}

type Same = (a: never, b: never) => boolean;
const identical: Same = (a, b) => a === b;

/**
 * The options that decide which record a request maps to, what is stored and replayed, and how the request is
 * answered, by name, with how their resolved values compare. Not here: `required` and `methods` (the registration
 * that took the request had the key and covered the method, so another's say nothing more about it), and
 * `logger` and `hooks` (they observe; the registration that handles the request reports it).
 */
const DECIDING: Record<string, (outer: ResolvedOptions<never>, inner: ResolvedOptions<never>) => boolean> = {
  store: (a, b) => a.store === b.store,
  ttl: (a, b) => a.ttlMs === b.ttlMs,
  lockTimeout: (a, b) => a.lockTimeoutMs === b.lockTimeoutMs,
  header: (a, b) => a.header === b.header,
  maxKeyLength: (a, b) => a.maxKeyLength === b.maxKeyLength,
  // Not set and `false` are both unscoped: the same records.
  scope: (a, b) => (a.scope ?? false) === (b.scope ?? false),
  fingerprint: (a, b) => identical(a.fingerprint as never, b.fingerprint as never),
  inProgress: (a, b) => a.waitMs === b.waitMs,
  inProgressStatus: (a, b) => a.inProgressStatus === b.inProgressStatus,
  cacheable: (a, b) => a.cacheable === b.cacheable,
  maxBodyBytes: (a, b) => a.maxBodyBytes === b.maxBodyBytes,
  excludeHeaders: (a, b) =>
    a.excludedHeaders.size === b.excludedHeaders.size &&
    [...a.excludedHeaders].every((name) => b.excludedHeaders.has(name)),
  onStoreError: (a, b) => a.failOpen === b.failOpen,
  transactional: (a, b) => a.transactional === b.transactional,
};

/**
 * The options `inner` sets to something else than `outer` (the options of the registration that took the request)
 * among those that decide what happens to it: empty when `inner` may leave the request to `outer` unchanged.
 */
export function conflictingOptions<Req>(outer: ResolvedOptions<Req>, inner: Registration<Req>): string[] {
  const names: string[] = [];
  for (const name of inner.set) {
    const same = DECIDING[name];
    if (
      same !== undefined &&
      !same(outer as ResolvedOptions<never>, inner.engine.options as ResolvedOptions<never>)
    )
      names.push(name);
  }
  return names;
}

/** What an adapter answers, and logs, when a nested registration refuses a request another one took first. */
export interface NestedRefusal {
  /** The 500 problem+json to send. */
  response: StoredResponse;
  /** The error to release the outer registration's key with. */
  error: Error;
}

const NESTED_DOCS = 'https://github.com/oncely/oncely/blob/main/docs/semantics.md#nested-registrations';

/**
 * Refuses a request that `outer` took first and `inner`, nearer the route, would handle otherwise (`names` differ):
 * logs it (an error through a logger; without one, a process warning once per registration) and gives the answer.
 * Neither registration's settings can be applied silently: the outer's would put the request in the wrong records,
 * and the inner's cannot, since the outer already answered for its key.
 */
export function refuseNested(
  outer: Registration<never> | string,
  inner: Registration<never>,
  names: readonly string[],
): NestedRefusal {
  const outerSite = typeof outer === 'string' ? outer : outer.site;
  const message = `oncely: two idempotency registrations cover this request and set ${names.join(', ')} differently: ${outerSite} took it first, and ${inner.site}, nearer the route, would handle it otherwise. The request was refused (500) and the first one's key released. Give the inner one the same values, or cover the route with one registration only. ${NESTED_DOCS}`;
  const log =
    inner.engine.options.logger ?? (typeof outer === 'string' ? undefined : outer.engine.options.logger);
  if (log !== undefined) log.error({ options: names, docs: NESTED_DOCS }, message);
  else if (!inner.warned && typeof globalThis.process?.emitWarning === 'function') {
    inner.warned = true;
    process.emitWarning(message, { code: 'ONCELY_NESTED_REGISTRATIONS' });
  }
  return {
    error: new Error(message),
    response: problemResponse({
      type: PROBLEM_TYPES.conflictingRegistrations,
      title: 'Conflicting idempotency registrations',
      status: 500,
      // Where each registration was created is in the log only: source paths are not the client's business.
      detail: `Two idempotency registrations cover this request and set ${names.join(', ')} differently; the request was not processed. The server log names both.`,
    }),
  };
}
