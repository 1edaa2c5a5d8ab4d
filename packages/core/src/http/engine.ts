import { asStoredFingerprint, hasLoneSurrogate } from '../shared/checks';
import { InvalidValueError } from '../shared/errors';
import { HookRunner } from '../shared/hooks';
import { type Logger, silentLogger } from '../shared/logger';
import { observedStore } from '../shared/observe';
import { KeyProtocol, type LeaseSettings, unknownStatusError, verdictOf, Wait } from '../shared/protocol';
import { type StepSettings, stepSettings } from '../shared/steps';
import { errorText, tell, type WarningCode } from '../shared/warnings';
import type {
  AcquiredResult,
  AcquireResult,
  CompletedResult,
  IdempotencyStore,
  InProgressResult,
  StoredResponse,
  TransactionAcquiredResult,
} from '../stores/store';
import { Execution } from './execution';
import { defaultFingerprint } from './fingerprint';
import { OMITTED_BODY_HEADER } from './headers';
import { type KeyProblem, parseKey } from './key';
import { type IdempotencyOptions, type ResolvedOptions, resolveOptions } from './options';
import { PROBLEM_TYPES, problemResponse } from './problems';

export type { IdempotencyContext } from '../shared/context';

/** What an adapter tells the engine about a request. */
export interface HttpRequestInput<Req> {
  /** The request method, as the client sent it. */
  method: string;
  /** Path and query as the client sent them (Express `req.originalUrl`, Fastify `request.url`). */
  url: string;
  /** Request headers with lower-case names (Node's `req.headers`). */
  headers: Readonly<Record<string, string | string[] | undefined>>;
  /** The parsed body (object, string, Buffer), or `undefined` when there is none or no parser ran. */
  body: unknown;
  /** The framework's request, handed to `scope` and `fingerprint`. */
  request: Req;
  /**
   * This request's lease settings (Lambda's deadline), over the `lockTimeout` option; no effect in transactional
   * mode, where the open transaction holds the key. Default: none.
   */
  lease?: LeaseSettings;
}

/** The engine's answer for one request. */
export type HttpDecision =
  /** Not ours: run the handler as if the middleware were not there. */
  | {
      /** What the adapter does with the request. */
      action: 'pass';
    }
  /** Send this response (a replay, or a problem+json error); do not run the handler. */
  | {
      /** What the adapter does with the request. */
      action: 'respond';
      /** The response to send. */
      response: StoredResponse;
      /** `true` for a stored response replayed, `false` for an error answer. */
      replayed: boolean;
    }
  /** Run the handler, capture its response and hand it to `execution.complete()` (or `fail()` if it threw). */
  | {
      /** What the adapter does with the request. */
      action: 'execute';
      /** The execution that owns the key while the handler runs. */
      execution: Execution;
    };

const PASS: HttpDecision = { action: 'pass' };

const UNSCOPED_DOCS =
  'https://github.com/oncely/oncely/blob/main/docs/security.md#always-set-scope-on-an-authenticated-api';

const KEY_PROBLEM_DETAIL: Record<KeyProblem, string> = {
  empty: 'is empty',
  'too-long': 'is too long',
  'not-visible-ascii': 'must contain only visible ASCII characters (0x21-0x7E)',
  'malformed-string': 'is not a well-formed RFC 8941 string',
  'multiple-values': 'was sent more than once',
};

/**
 * The idempotency engine. It owns every policy decision — key parsing, scope, fingerprint, what to do with each
 * store answer, what to store, lease renewal, error answers — so adapters only translate requests and responses.
 */
export class Idempotency<Req = unknown> {
  /** The options after validation, with defaults applied. */
  readonly options: ResolvedOptions<Req>;
  // Shared with the engines made by with(), so a plugin and its routes warn once between them.
  readonly #unscopedWarning: { given: boolean };
  // The process warnings already emitted (without a logger), shared with with() copies too: said once each.
  readonly #warned: Set<WarningCode>;
  #unparsedBodyWarned = false;
  /**
   * Replay headers built once per stored headers object (a MemoryStore hands out the same one on every replay), per
   * engine since its `excludeHeaders` filter them: no copy of the headers per replay. Stores that deserialise a
   * fresh object per read pay one WeakMap insert.
   */
  readonly #replays = new WeakMap<object, ReplayTemplate>();
  /**
   * @internal The store as the engine calls it: `options.store` itself, or, with an `onStoreOperation` hook, a
   * wrapper timing each operation (shared/observe.ts).
   */
  readonly observedStore: IdempotencyStore;
  /** The guarded runner of this engine's hooks. */
  readonly #hooks: HookRunner;
  /** What the engine and its executions do with each answer of the store; each execution is handed it. */
  readonly #protocol: KeyProtocol;
  /** @internal What the steps of this engine's executions share (`step()`): made once, read at the first step. */
  readonly stepSettings: StepSettings;

  /**
   * Checks `options` (an `IdempotencyOptionsError` names a wrong one) and applies the defaults. `base`: an engine
   * whose options these override (what `with()` passes); `extraKnownOptions`: option names an adapter adds, which
   * are then not reported as unknown.
   */
  constructor(
    options: IdempotencyOptions<Req> = {},
    base?: Idempotency<Req>,
    extraKnownOptions?: ReadonlySet<string>,
  ) {
    this.options = resolveOptions(options, base?.options, extraKnownOptions);
    this.#unscopedWarning = base === undefined ? { given: false } : base.#unscopedWarning;
    this.#warned = base === undefined ? new Set() : base.#warned;
    const log = this.options.logger ?? silentLogger;
    const hooks = new HookRunner(this.options.hooks, 'http', this.#warned);
    this.#hooks = hooks;
    this.observedStore = observedStore(this.options.store, 'http', this.options.hooks, (event) =>
      hooks.run('onStoreOperation', event, log),
    );
    this.#protocol = new KeyProtocol(this.observedStore, hooks, this.options.lockTimeoutMs);
    this.stepSettings = stepSettings(this.#protocol, this.options.ttlMs);
  }

  /** An engine with `overrides` over this one's options (a route's options over its plugin's). */
  with(overrides: IdempotencyOptions<Req>): Idempotency<Req> {
    return new Idempotency(overrides, this);
  }

  /**
   * For adapters that fingerprint a body parsed by someone else (Express's `req.body`, Koa's `ctx.request.body`):
   * logs once, at `warn`, when a request with a key carries a body that no parser read (`body` undefined), since the
   * fingerprint then ignores it. `parser` names what to mount, for the message.
   */
  warnIfBodyUnparsed(
    headers: Readonly<Record<string, string | string[] | undefined>>,
    body: unknown,
    parser: string,
  ): void {
    if (
      this.#unparsedBodyWarned ||
      body !== undefined ||
      this.options.fingerprint !== undefined ||
      headers[this.options.header] === undefined ||
      ((headers['content-length'] ?? '0') === '0' && headers['transfer-encoding'] === undefined)
    ) {
      return;
    }
    this.#unparsedBodyWarned = true;
    tell(
      this.options.logger ?? silentLogger,
      'warn',
      'ONCELY_BODY_NOT_PARSED',
      {},
      `oncely: the request body was not parsed, so the fingerprint ignores it and a key reused with another body is replayed instead of refused (422); mount ${parser} before idempotency()`,
      this.#warned,
    );
  }

  /** Whether requests with this method are covered at all; adapters use it to skip work for the others. */
  covers(method: string): boolean {
    return this.options.methods.has(method);
  }

  /**
   * Whether `handle` would pass a request with this method, with or without the key header, untouched: adapters
   * that must read the body for the fingerprint (the fetch ones) ask this first, so most requests cost nothing.
   */
  passes(method: string, hasKey: boolean): boolean {
    return !this.options.methods.has(method) || (!hasKey && !this.options.required);
  }

  /**
   * The answer to a covered request whose body could not be read (the stream failed or was cut), so it cannot be
   * checked against its key: a 400, with a warning logged. The handler does not run.
   */
  unreadableBody(error: unknown, log: Logger = this.options.logger ?? silentLogger): StoredResponse {
    log.warn({ err: error }, 'oncely: the request body could not be read');
    return problemResponse({
      type: PROBLEM_TYPES.bodyUnreadable,
      title: 'Request body unreadable',
      status: 400,
      detail: 'The request body could not be read, so the request cannot be checked against its key.',
    });
  }

  /**
   * Decides what to do with a request. Never rejects: store failures, a throwing `scope` or `fingerprint`, bad
   * keys all become a `respond` decision (or, with `onStoreError: 'fail-open'`, an unprotected execution).
   */
  async handle(
    input: HttpRequestInput<Req>,
    log: Logger = this.options.logger ?? silentLogger,
  ): Promise<HttpDecision> {
    const o = this.options;
    const raw = input.headers[o.header];
    if (this.passes(input.method, raw !== undefined)) return PASS;
    if (raw === undefined) {
      log.debug({ header: o.header }, 'oncely: idempotency key missing');
      this.#hooks.decided('rejected', undefined, undefined, log);
      return this.#problem(
        400,
        'keyMissing',
        'Idempotency key missing',
        `This request requires an ${o.header} header.`,
      );
    }
    const clientKey = parseKey(raw, o.maxKeyLength);
    if (typeof clientKey !== 'string') {
      log.debug({ header: o.header, problem: clientKey.problem }, 'oncely: invalid idempotency key');
      const detail =
        clientKey.problem === 'too-long'
          ? `The ${o.header} header is longer than ${o.maxKeyLength} characters.`
          : `The ${o.header} header ${KEY_PROBLEM_DETAIL[clientKey.problem]}.`;
      this.#hooks.decided('rejected', undefined, undefined, log);
      return this.#problem(400, 'keyInvalid', 'Invalid idempotency key', detail);
    }

    let key: string;
    let fingerprint: string;
    try {
      // A scope may hold any character; the key cannot hold a space, so the last space splits them unambiguously.
      if (o.scope === undefined) {
        key = clientKey;
        if (!this.#unscopedWarning.given) this.#warnIfCredentials(input.headers, log);
      } else if (o.scope === false) key = clientKey;
      else {
        const scope: unknown = o.scope(input.request);
        // Anything but a string (a Promise from an async scope, undefined) would merge scopes: refuse it.
        if (typeof scope !== 'string')
          throw new InvalidValueError(`scope() must return a string; it returned ${typeof scope}`);
        if (hasLoneSurrogate(scope)) {
          throw new InvalidValueError(
            'scope() returned a string with a lone surrogate (not well-formed Unicode), which a store keeping UTF-8 would confuse with another scope',
          );
        }
        if (looksUnset(scope)) {
          throw new UnsetScopeError(
            `oncely: scope() returned ${JSON.stringify(scope.length > 80 ? `${scope.slice(0, 80)}…` : scope)}, which holds what a template literal makes of a missing value (a segment \`undefined\`, or \`[object Object]\`): every request without it would share one scope, so it was refused (500). Give those requests a scope of their own (req.user ? \`user:\${req.user.id}\` : 'anonymous') or make the scope function throw`,
          );
        }
        key = `${scope} ${clientKey}`;
      }
      fingerprint =
        o.fingerprint === false
          ? ''
          : o.fingerprint === undefined
            ? defaultFingerprint(input.method, input.url, input.body)
            : asStoredFingerprint(o.fingerprint(input.request));
    } catch (error) {
      if (error instanceof UnsetScopeError) {
        // A wiring mistake that fails every such request: heard without a logger too (once per engine).
        tell(
          log,
          'error',
          'ONCELY_SCOPE_UNSET',
          { err: error },
          log === silentLogger ? `${error.message}. Said once; give a logger to see each.` : error.message,
          this.#warned,
        );
      } else log.error({ err: error }, 'oncely: the scope or fingerprint function threw');
      return this.#problem(
        500,
        'internal',
        'Idempotency check failed',
        'The server could not compute the idempotency scope or fingerprint.',
      );
    }

    let result: AcquireResult | TransactionAcquiredResult;
    try {
      result = await this.#acquire(key, fingerprint, input.lease);
    } catch (error) {
      return this.#storeDown(key, error, log, clientKey, undefined);
    }

    // Made at the first in_progress answer in wait mode only.
    let wait: Wait | undefined;
    for (;;) {
      switch (verdictOf(result, fingerprint, o.fingerprint !== false)) {
        case 'acquired': {
          const acquired = result as AcquiredResult | TransactionAcquiredResult;
          this.#hooks.run('onMiss', { key }, log);
          this.#hooks.decided('executed', key, wait?.start, log);
          return {
            action: 'execute',
            execution: new Execution(
              this,
              this.#protocol,
              key,
              clientKey,
              acquired.token,
              log,
              'transaction' in acquired ? acquired.transaction : undefined,
              // Steps in a transaction are kept in memory only: a record's earlier ones are not resumed.
              'transaction' in acquired ? undefined : acquired.steps,
              input.lease,
            ),
          };
        }
        case 'completed':
          this.#hooks.run('onHit', { key }, log);
          this.#hooks.decided('replayed', key, wait?.start, log);
          return {
            action: 'respond',
            response: this.#replayOf((result as CompletedResult).response),
            replayed: true,
          };
        case 'mismatch':
          // A resumed record kept for another fingerprint was acquired all the same: give it back untouched (in a
          // transaction, roll it back).
          await this.#protocol.giveBack(key, result, log);
          return this.#mismatch(key, log, wait?.start);
        case 'in_progress': {
          const { retryAfterMs } = result as InProgressResult;
          if (wait === undefined) {
            this.#hooks.run('onConflict', { key, retryAfterMs }, log);
            if (o.waitMs !== undefined) wait = new Wait(o.waitMs);
          }
          if (wait === undefined || !(await wait.next(this.#protocol.store, key, retryAfterMs))) {
            this.#hooks.decided('conflict', key, wait?.start, log);
            return this.#conflict();
          }
          try {
            result = await this.#acquire(key, fingerprint, input.lease);
          } catch (error) {
            return this.#storeDown(key, error, log, clientKey, wait.start);
          }
          break;
        }
        default:
          // A store bug, not a decision: refuse rather than guess.
          return this.#storeDown(key, unknownStatusError(result), log, clientKey, wait?.start);
      }
    }
  }

  /**
   * The answer replaying a stored response: its headers less those `excludeHeaders` names now (a name added after
   * the record was stored is kept out of its replays too), with `content-length` and the replay marker. Arrays are
   * copied per replay: Node keeps the array `setHeader` got, and `appendHeader` pushes into it.
   */
  #replayOf(stored: StoredResponse): StoredResponse {
    if (stored.headers[OMITTED_BODY_HEADER] !== undefined) return omittedReplay(stored.status);
    let template = this.#replays.get(stored.headers);
    // A store may share one headers object between records (an empty one, say): check what depends on the record.
    if (
      template === undefined ||
      template.status !== stored.status ||
      template.length !== stored.body.byteLength
    ) {
      template = buildReplay(stored, this.options.excludedHeaders);
      this.#replays.set(stored.headers, template);
    }
    return {
      status: stored.status,
      headers: template.arrays ? copyArrays(template.headers) : template.headers,
      body: stored.body,
    };
  }

  /**
   * A request with credentials on an engine without `scope`: the record its key names is shared by every caller,
   * so another user sending the same key gets this one's response. Said once per engine (and its with() copies).
   */
  #warnIfCredentials(headers: HttpRequestInput<Req>['headers'], log: Logger): void {
    const header =
      headers.authorization !== undefined
        ? 'authorization'
        : headers.cookie !== undefined
          ? 'cookie'
          : undefined;
    if (header === undefined) return;
    this.#unscopedWarning.given = true;
    const message = `oncely: a request with ${header === 'authorization' ? 'an Authorization' : 'a Cookie'} header is covered without a scope, so every caller shares one key space and a caller sending another's key gets that caller's stored response; set scope to the authenticated identity (scope: (req) => req.user.id, or scopeByHeader('authorization', { secret }) for API keys), or scope: false if one key space is intended. Said once. ${UNSCOPED_DOCS}`;
    tell(log, 'warn', 'ONCELY_UNSCOPED_CREDENTIALS', { header, docs: UNSCOPED_DOCS }, message, this.#warned);
    this.#hooks.run('onUnscopedCredentials', { header }, log);
  }

  #acquire(
    key: string,
    fingerprint: string,
    lease: LeaseSettings | undefined,
  ): Promise<AcquireResult | TransactionAcquiredResult> {
    // In a transaction the open transaction holds the key, not a lease: endsAt has nothing to bound there.
    return this.options.transactional
      ? this.#protocol.acquireInTransaction(key, fingerprint)
      : this.#protocol.acquire(key, fingerprint, lease?.endsAt);
  }

  #problem(
    status: number,
    type: keyof typeof PROBLEM_TYPES,
    title: string,
    detail: string,
    headers?: Record<string, string>,
  ): HttpDecision {
    return {
      action: 'respond',
      replayed: false,
      response: problemResponse({ type: PROBLEM_TYPES[type], title, status, detail }, headers),
    };
  }

  #mismatch(key: string, log: Logger, waitStart: number | undefined): HttpDecision {
    this.#hooks.run('onMismatch', { key }, log);
    this.#hooks.decided('mismatch', key, waitStart, log);
    log.info({ key }, 'oncely: idempotency key reused with a different request');
    return this.#problem(
      422,
      'mismatch',
      'Idempotency key reused',
      'This idempotency key was already used with a different request (method, path, query or body). Use a new key for a new request.',
    );
  }

  #conflict(): HttpDecision {
    const status = this.options.inProgressStatus;
    // Retry-After is 1s, not the remaining lease: the lease is renewed while the first request runs, so it says
    // nothing about when that request ends; it only bounds how long a crashed owner blocks the key.
    return this.#problem(
      status,
      'inProgress',
      'Request in progress',
      'A request with this idempotency key is still being processed. Retry after it finishes.',
      { 'retry-after': '1' },
    );
  }

  /** A store outage is logged each time; without a logger it is a process warning, once, with the store's error. */
  #storeUnavailable(log: Logger, level: 'warn' | 'error', error: unknown, key: string, what: string): void {
    tell(
      log,
      level,
      'ONCELY_STORE_UNAVAILABLE',
      { err: error, key },
      log === silentLogger
        ? `oncely: ${what}: ${errorText(error)}. Said once; give a logger to see each.`
        : `oncely: ${what}`,
      this.#warned,
    );
  }

  #storeDown(
    key: string,
    error: unknown,
    log: Logger,
    clientKey: string,
    waitStart: number | undefined,
  ): HttpDecision {
    this.#protocol.acquireFailed(key, error, waitStart, log);
    if (this.options.failOpen) {
      this.#storeUnavailable(
        log,
        'warn',
        error,
        key,
        'store unavailable; running the handler WITHOUT idempotency protection (fail-open)',
      );
      return {
        action: 'execute',
        execution: new Execution(this, this.#protocol, key, clientKey, undefined, log),
      };
    }
    this.#storeUnavailable(log, 'error', error, key, 'store unavailable; answering 503 (fail-closed)');
    return this.#problem(
      503,
      'storeUnavailable',
      'Idempotency store unavailable',
      'The request was not processed because its idempotency key could not be checked. Retry with the same key.',
      { 'retry-after': '1' },
    );
  }
}

interface ReplayTemplate {
  status: number;
  /** Body length the headers' `content-length` was built for. */
  length: number;
  headers: Record<string, string | string[]>;
  /** Whether a header value is an array (copied per replay). */
  arrays: boolean;
}

function buildReplay(stored: StoredResponse, excluded: ReadonlySet<string>): ReplayTemplate {
  const headers: Record<string, string | string[]> = {};
  let arrays = false;
  for (const name in stored.headers) {
    if (excluded.has(name) || name.startsWith('proxy-')) continue;
    const value = stored.headers[name] as string | string[];
    if (typeof value !== 'string') arrays = true;
    headers[name] = value;
  }
  // 1xx, 204 and 304 responses carry no body and must not carry Content-Length (RFC 9110, section 8.6).
  const bodiless = stored.status < 200 || stored.status === 204 || stored.status === 304;
  if (!bodiless) headers['content-length'] = String(stored.body.byteLength);
  headers['idempotent-replayed'] = 'true';
  return { status: stored.status, length: stored.body.byteLength, headers, arrays };
}

function copyArrays(headers: Record<string, string | string[]>): Record<string, string | string[]> {
  const copy: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name] as string | string[];
    copy[name] = typeof value === 'string' ? value : [...value];
  }
  return copy;
}

function omittedReplay(status: number): StoredResponse {
  return problemResponse(
    {
      type: PROBLEM_TYPES.responseNotStored,
      title: 'Response not stored',
      status: 410,
      detail: `The request with this idempotency key was executed (status ${status}), but its response was not kept (larger than maxBodyBytes, written outside oncely, or cut short when its client left). It will not be executed again.`,
      originalStatus: status,
    },
    { 'idempotent-replayed': 'true' },
  );
}

/**
 * `undefined` as a whole segment, between separators (`:` `/` `|` `.` `,` `;` `=` `#`, whitespace) or the ends of
 * the scope, or `[object Object]`-style text: what a template literal makes of a missing value. `-`, `_` and `@` are
 * not separators, since they join the parts of a real name (`undefined-labs`, `undefined@example.com`).
 */
const UNSET_IN_SCOPE = /(?:^|[:/|.,;=#\s])undefined(?=$|[:/|.,;=#\s])|\[object [A-Za-z]\w*\]/;

/**
 * Whether a scope holds what `user:${req.user?.id}` gives a request without a user, which would put every such
 * request in one scope. A cheap `includes` first: scopes rarely match.
 */
function looksUnset(scope: string): boolean {
  return (scope.includes('undefined') || scope.includes('[object ')) && UNSET_IN_SCOPE.test(scope);
}

/** A scope refused by `looksUnset`: reported as a wiring mistake, not as a scope function that threw. */
class UnsetScopeError extends InvalidValueError {
  override name = 'UnsetScopeError';
}
