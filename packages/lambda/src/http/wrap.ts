import {
  type Duration,
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  InvalidValueError,
  type Logger,
  type StoredResponse,
} from '@oncely/core';
import {
  conflictingOptions,
  durationOption,
  type Execution,
  type LeaseSettings,
  type Registration,
  refuseNested,
  registrationOf,
  silentLogger,
} from '@oncely/core/adapter';
import type { Context } from 'aws-lambda';
import { bodyOf, type EventRequest, type HttpEvent, kindOf, type ResultFor, readEvent } from './events';
import { captureResult, toResult } from './results';

/**
 * Options of the HTTP wrappers: the shared options (docs/options.md), `scope` and `fingerprint` getting the event,
 * and `leaseMargin`.
 */
export type LambdaIdempotencyOptions<E = HttpEvent> = IdempotencyOptions<E> & {
  /**
   * How long past the invocation's deadline (`context.getRemainingTimeInMillis()`) the lease may run, when
   * `lockTimeout` is not set: a retry sent after a timeout takes the key over once it has passed. Default `'1s'`.
   */
  leaseMargin?: Duration;
};

/** The options only the Lambda wrappers know. */
export const LAMBDA_OPTIONS: ReadonlySet<string> = new Set(['leaseMargin']);

const DEFAULT_MARGIN_MS = 1000;

// The context of each covered event, for the handler to read (idempotencyOf). A WeakMap: nothing outlives the event.
const contexts = new WeakMap<object, IdempotencyContext>();

/**
 * The key (and, in transactional mode, the transaction's client) of an event oncely covers, from inside its
 * handler; else `undefined`. `currentIdempotency()` answers the same anywhere the handler calls.
 */
export function idempotencyOf(event: object): IdempotencyContext | undefined {
  return contexts.get(event);
}

/** @internal Marks `event` as covered by `context` (the Powertools router's middleware does too). */
export function noteContext(event: object, context: IdempotencyContext): void {
  contexts.set(event, context);
}

/** The registration that took an event, as a nested one leaving the event to it runs the handler under it. */
export interface Outer {
  /** Runs `fn` (the handler) under the outer one's execution: `currentIdempotency()` answers inside it. */
  run<T>(fn: () => T): T;
}

/**
 * @internal The registration that took an event, while its handler runs: another one the same event meets nearer
 * the handler (a handler wrapped twice, a Middy middleware with `withIdempotency` inside it, the router's middleware
 * around either) leaves the event to it or refuses it.
 */
export interface Holder {
  readonly registration: Registration<never>;
  readonly outer: Outer;
  /** A registration nearer the handler refused the event: the holder's key is to be released, nothing stored. */
  readonly refused: (error: Error) => Promise<void>;
  /**
   * Middy's request object when a Middy middleware took the event. Middy skips the `after` phase after an early
   * response, leaving the mark behind: that middleware meeting its own mark in another invocation is not nested.
   */
  readonly invocation: object | undefined;
}

// Keyed by the event object, removed when the handler has finished, so the same event invoked again is not nested.
const holders = new WeakMap<object, Holder>();

/** @internal Whether a registration has taken `event` (a cheap test before `LambdaHttp.nested`). */
export function takenFirst(event: unknown): boolean {
  return typeof event === 'object' && event !== null && holders.has(event);
}

/**
 * @internal Notes that `holder` took `event` (the Powertools router's middleware does too, its handler possibly a
 * `withIdempotency` or Middy handler of the same event); the function returned removes the note once the handler
 * has finished.
 */
export function hold(event: object, holder: Holder): () => void {
  holders.set(event, holder);
  return () => {
    if (holders.get(event) === holder) holders.delete(event);
  };
}

/** What a registration does with an event another one took first (`LambdaHttp.nested`). */
export type NestedDecision =
  /** Leave it to the outer one: run the handler under its execution. */
  | { outer: Outer; refusal?: undefined }
  /**
   * Refused (the outer one's key is released already, or by the router's middleware once the route returns): send
   * this answer, the handler not run.
   */
  | { outer?: undefined; refusal: StoredResponse };

/** A Lambda handler of HTTP events: `(event, context) => result`. */
export type LambdaHttpHandler<E extends HttpEvent, R> = (event: E, context: Context) => R | Promise<R>;

/**
 * The engine and lease settings one wrapper (or middleware) shares across its invocations. `E` is what `scope` and
 * `fingerprint` get: the event, or the Powertools router's request context.
 */
export class LambdaHttp<E> {
  readonly engine: Idempotency<E>;
  /** This wrapper as a registration, for the nested-registration checks. */
  readonly registration: Registration<E>;
  readonly #marginMs: number | undefined;
  readonly #log: Logger;

  /** `createdBy` is the function the application called, so that a conflict names the application's line. */
  constructor(options: LambdaIdempotencyOptions<E>, what: string, createdBy: (...args: never[]) => unknown) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidValueError(`oncely: ${what} needs an options object ({ store, ... })`);
    }
    const { leaseMargin, ...shared } = options;
    this.engine = new Idempotency<E>(shared as IdempotencyOptions<E>, undefined, LAMBDA_OPTIONS);
    this.registration = registrationOf(this.engine, shared as IdempotencyOptions<E>, createdBy, what);
    const margin = leaseMargin === undefined ? DEFAULT_MARGIN_MS : durationOption('leaseMargin', leaseMargin);
    // An explicit lockTimeout wins: the lease then ignores the deadline.
    this.#marginMs = options.lockTimeout === undefined ? margin : undefined;
    this.#log = this.engine.options.logger ?? silentLogger;
  }

  get log(): Logger {
    return this.#log;
  }

  /** The lease settings of one invocation: it never runs past the invocation's deadline plus the margin. */
  leaseOf(context: Context | undefined): LeaseSettings | undefined {
    const margin = this.#marginMs;
    if (margin === undefined || typeof context?.getRemainingTimeInMillis !== 'function') return undefined;
    const remaining = context.getRemainingTimeInMillis();
    if (!Number.isFinite(remaining)) return undefined;
    return { endsAt: Date.now() + Math.max(0, remaining) + margin };
  }

  /** Reads the event, or says it is not an HTTP event (a wiring mistake: an SQS handler, say). */
  request(event: unknown): EventRequest {
    const kind = kindOf(event);
    if (kind === undefined) {
      const error = new InvalidValueError(
        'oncely: withIdempotency() got an event that is not an API Gateway, Function URL or ALB event; for SQS, Kinesis, DynamoDB Streams or Kafka use idempotentBatch()',
      );
      this.#log.error({ err: error }, error.message);
      throw error;
    }
    return readEvent(event as HttpEvent, kind);
  }

  /**
   * What to do with one event: `{ result }` to answer at once (a replay or a problem, in the event's format),
   * `{ execution }` to run the handler under (this registration took the event: `settle` or `failed` follows),
   * `{ outer }` to run it under the execution of a registration that took it first, or `{}` to run it untouched.
   * `invocation` is Middy's request object, for a Middy middleware.
   */
  async decide(
    event: E,
    request: EventRequest,
    context: Context | undefined,
    invocation?: object,
  ): Promise<{ result?: ResultFor<E>; execution?: Execution; outer?: Outer }> {
    const engine = this.engine;
    if (engine.passes(request.method, request.headers[engine.options.header] !== undefined)) return {};
    // A WeakMap lookup, and no await, unless another registration took the event first.
    if (holders.has(event as object)) {
      const nested = await this.nested(event as object, invocation);
      if (nested?.outer !== undefined) return { outer: nested.outer };
      if (nested !== undefined) return { result: toResult<ResultFor<E>>(nested.refusal, request) };
    }
    const decision = await engine.handle({
      method: request.method,
      url: request.url,
      headers: request.headers,
      body:
        engine.options.fingerprint === undefined ? bodyOf(event as HttpEvent, request.headers) : undefined,
      request: event,
      lease: this.leaseOf(context),
    });
    if (decision.action === 'pass') return {};
    if (decision.action === 'respond') return { result: toResult<ResultFor<E>>(decision.response, request) };
    contexts.set(event as object, decision.execution.context);
    const { execution } = decision;
    hold(event as object, {
      registration: this.registration as Registration<never>,
      outer: execution,
      refused: (error) => execution.fail(error),
      invocation,
    });
    return { execution };
  }

  /**
   * Whether another registration took `event` first (this one covers it, and runs inside that one's handler):
   * `undefined` when none did. One registration handles each event: this one leaves the event to the outer one
   * when the deciding options it sets agree with the outer one's, and else refuses it, releasing the outer one's
   * key (nothing is stored): neither one's options may be applied in place of the other's.
   */
  async nested(event: object, invocation: object | undefined): Promise<NestedDecision | undefined> {
    const holder = holders.get(event);
    if (holder === undefined) return undefined;
    const own = holder.registration === (this.registration as Registration<never>);
    // This Middy middleware's mark from an invocation whose `after` Middy skipped: not an outer registration.
    if (own && holder.invocation !== undefined && holder.invocation !== invocation) return undefined;
    const names = own
      ? []
      : conflictingOptions(holder.registration.engine.options, this.registration as Registration<never>);
    if (names.length === 0) return { outer: holder.outer };
    const refusal = refuseNested(holder.registration, this.registration as Registration<never>, names);
    // Released here, not by the outer one when its handler returns: Middy runs no `after` after an early response.
    holders.delete(event);
    await holder.refused(refusal.error);
    return { refusal: refusal.response };
  }

  /** The handler of an event this registration took has finished: another invocation of it is not nested. */
  #finished(event: object, execution: Execution): void {
    if (holders.get(event)?.outer === execution) holders.delete(event);
  }

  /**
   * Stores the handler's result (or releases the key when it cannot be stored) and returns what to send: the
   * result itself, or the engine's answer instead of it (a failed transactional commit, an invalid status).
   */
  async settle<R>(
    event: object,
    execution: Execution,
    request: EventRequest,
    result: R,
  ): Promise<R | ResultFor<E>> {
    this.#finished(event, execution);
    // Where a registration nearer the handler refused the event, it released the key: `complete` stores nothing,
    // and its answer (the result) is sent.
    const captured = captureResult(result, request, execution.maxBodyBytes);
    if (typeof captured === 'string') {
      // The platform answers such a result with a 502: nothing to store, and the key is released for a retry.
      const error = new InvalidValueError(
        `oncely: the handler returned ${captured}, which ${request.kind === 'alb' ? 'an ALB' : 'API Gateway'} answers with a 502; the key is released`,
      );
      this.#log.error({ err: error, key: execution.key }, error.message);
      await execution.fail(error);
      return result;
    }
    const replacement = await execution.complete(captured);
    return replacement === undefined ? result : toResult<ResultFor<E>>(replacement, request);
  }

  /** The handler threw: the key is released (a retry runs it again) and the error goes on to Lambda. */
  async failed(event: object, execution: Execution, error: unknown): Promise<void> {
    this.#finished(event, execution);
    this.#log.warn({ err: error, key: execution.key }, 'oncely: the handler threw; its key is released');
    await execution.fail(error);
  }
}

/**
 * Wraps a Lambda handler of API Gateway (REST and HTTP API), Function URL or ALB events:
 * `export const handler = withIdempotency(async (event, context) => ({ statusCode: 201, body }), { store })`.
 * The first invocation with a key runs the handler, and its result is stored before it is returned; a retry gets
 * it back with `Idempotent-Replayed: true`, in the event's own result format. A handler that throws releases the
 * key, and the error goes on to Lambda. Options are checked here, once.
 */
export function withIdempotency<E extends HttpEvent, R>(
  handler: LambdaHttpHandler<E, R>,
  options: LambdaIdempotencyOptions<E> = {},
): (event: E, context: Context) => Promise<R | ResultFor<E>> {
  if (typeof handler !== 'function') {
    throw new InvalidValueError(
      'oncely: withIdempotency(handler, options) needs the Lambda handler as its first argument.',
    );
  }
  const lambda = new LambdaHttp<E>(options, 'withIdempotency(handler, options)', withIdempotency);
  return async function idempotentHandler(event: E, context: Context): Promise<R | ResultFor<E>> {
    const request = lambda.request(event);
    const { result, execution, outer } = await lambda.decide(event, request, context);
    if (result !== undefined) return result;
    // Nested in a registration that took the event (a Middy middleware around this wrapper): run under its
    // execution, so currentIdempotency() answers in the handler there too.
    if (outer !== undefined) return outer.run(() => handler(event, context));
    if (execution === undefined) return handler(event, context);
    let value: R;
    try {
      // Inside the execution's context: currentIdempotency(), step() and keyFor() answer anywhere in the handler.
      value = await execution.run(() => handler(event, context));
    } catch (error) {
      await lambda.failed(event, execution, error);
      throw error;
    }
    return lambda.settle(event, execution, request, value);
  };
}
