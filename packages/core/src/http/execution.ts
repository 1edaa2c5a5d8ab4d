import { type IdempotencyContext, runInContext } from '../shared/context';
import { CommitOutcomeUnknownError, ValueOutOfRangeError } from '../shared/errors';
import type { ReleaseEvent } from '../shared/hooks';
import type { Logger } from '../shared/logger';
import { type KeyProtocol, Lease, type LeaseSettings } from '../shared/protocol';
import { ExecutionContext } from '../shared/steps';
import type { RecordedSteps, StoredResponse, StoreTransaction } from '../stores/store';
import type { Idempotency } from './engine';
import { OMITTED_BODY_HEADER, type OutgoingHeaderValue, storableHeaders } from './headers';
import { PROBLEM_TYPES, problemResponse } from './problems';

/** A finished response as the adapter captured it. `body` is `undefined` when it outgrew `maxBodyBytes`. */
export interface CapturedResponse {
  /** The response status. */
  status: number;
  /** The response headers as the handler set them. */
  headers: Readonly<Record<string, OutgoingHeaderValue>>;
  /** The body's bytes, or `undefined` when it outgrew `maxBodyBytes`. */
  body: Uint8Array | undefined;
}

/**
 * One request that owns its key. Renews the lease every third of `lockTimeout` while the handler runs; then
 * `complete()` stores the response (or releases the key when the status is not cacheable) and `fail()` releases.
 * Both wait for the store, so the client sees the response only once a retry would replay it, and never reject.
 * In transactional mode there is no lease: the key is held by the store transaction, which `complete()` commits
 * (with the handler's writes) and `fail()` rolls back.
 */
export class Execution {
  /** The key as the client sent it (unquoted), for `req.idempotencyKey`. */
  readonly clientKey: string;
  /** The store key: scope and client key. */
  readonly key: string;
  /** `false` when the store was down and `onStoreError: 'fail-open'` let the handler run unprotected. */
  readonly protected: boolean;
  /** Largest body stored; a larger one is sent but kept only as "executed" (its replay is a 410). */
  readonly maxBodyBytes: number;
  /**
   * How much of the body an adapter holds back before it may start streaming it to the client. Equal to
   * `maxBodyBytes`, except in transactional mode: nothing may reach the client before the commit, so all of it.
   */
  readonly bufferLimit: number;
  readonly #engine: Idempotency<never>;
  readonly #protocol: KeyProtocol;
  readonly #token: string | undefined;
  readonly #log: Logger;
  readonly #transaction: StoreTransaction | undefined;
  readonly #lease: Lease | undefined;
  #settled = false;
  /** The lease stopped and the context finished: after `#settled`, once running steps were waited for. */
  #ended = false;
  #context: ExecutionContext | undefined;
  /** The steps an earlier attempt of the key recorded, for the context to replay. */
  readonly #resumed: RecordedSteps | undefined;
  #headersBefore: Readonly<Record<string, OutgoingHeaderValue>> | undefined;

  /** @internal created by the engine, which hands it its protocol (no member of the engine's public type) */
  constructor(
    engine: Idempotency<never>,
    protocol: KeyProtocol,
    key: string,
    clientKey: string,
    token: string | undefined,
    log: Logger,
    transaction?: StoreTransaction,
    resumed?: RecordedSteps,
    lease?: LeaseSettings,
  ) {
    this.#engine = engine;
    this.#protocol = protocol;
    this.key = key;
    this.clientKey = clientKey;
    this.#token = token;
    this.#log = log;
    this.#transaction = transaction;
    this.#resumed = resumed;
    this.protected = token !== undefined;
    this.maxBodyBytes = engine.options.maxBodyBytes;
    this.bufferLimit = transaction === undefined ? this.maxBodyBytes : Number.POSITIVE_INFINITY;
    protocol.hooks.executionStarted(key, log);
    this.#lease =
      token !== undefined && transaction === undefined
        ? new Lease(protocol, key, token, log, lease)
        : undefined;
  }

  /** The transaction's database client in transactional mode (`req.idempotency.db`); otherwise `undefined`. */
  get db(): unknown {
    return this.#transaction?.db;
  }

  /** What the handler reads and calls (`req.idempotency`): the key, `db`, `step()` and `keyFor()`. */
  get context(): IdempotencyContext {
    if (this.#context === undefined) {
      // Steps are recorded under the lease's token; in a transaction (and fail-open) they are kept in memory only.
      this.#context = new ExecutionContext(
        this.key,
        this.clientKey,
        this.#transaction?.db,
        this.#engine.stepSettings,
        this.#log,
        this.#transaction === undefined ? this.#token : undefined,
        this.#resumed,
      );
      if (this.#ended) ExecutionContext.finish(this.#context);
    }
    return this.#context;
  }

  /**
   * Runs the handler (`fn`: the adapter's `next`, or the handler itself) so that `currentIdempotency()` anywhere
   * inside it, after any `await`, returns this execution's `context`.
   */
  run<T>(fn: () => T): T {
    return runInContext(this.context, fn);
  }

  /**
   * For adapters whose response object outer middleware writes to before the handler runs (Express, Fastify, Koa):
   * the response's headers when the handler starts (`res.getHeaders()`). Those still there unchanged at the end
   * are not stored: they belong to middleware outside oncely (CORS for this request's origin, a request id), which
   * sets them afresh on a replay, so a replay carries its own.
   */
  headersBeforeHandler(headers: Readonly<Record<string, OutgoingHeaderValue>>): void {
    this.#headersBefore = headers;
  }

  /**
   * Stores the finished response, or releases the key. Resolves to a response to send INSTEAD of the captured
   * one when the captured one must not reach the client: in transactional mode, when the commit failed (nothing
   * the handler wrote survived, so its success answer would be a lie). Otherwise resolves to `undefined`.
   */
  async complete(captured: CapturedResponse): Promise<StoredResponse | undefined> {
    if (this.#settle(this.#token !== undefined) || this.#token === undefined) return undefined;
    const o = this.#engine.options;
    let cacheable: boolean;
    let headers: Record<string, string | string[]>;
    try {
      if (!isValidStatus(captured.status)) {
        throw new ValueOutOfRangeError(
          `the response status ${String(captured.status)} is not an HTTP status (an integer from 100 to 999)`,
        );
      }
      cacheable = o.cacheable(captured.status);
      headers = cacheable ? storableHeaders(captured.headers, o.excludedHeaders, this.#headersBefore) : {};
    } catch (error) {
      // A bug in the app (an invalid status, a `cacheable` that throws): the request failed, as if the handler had
      // thrown; the captured answer is replaced by a 500, since nothing vouches for it.
      this.#log.error(
        { err: error, key: this.key, status: captured.status },
        'oncely: the response could not be judged (invalid status, or cacheable threw); answering 500 and releasing the key',
      );
      await this.#release('error');
      return internalErrorResponse();
    }
    if (!cacheable) {
      await this.#release('not-cacheable', captured.status);
      return undefined;
    }
    this.#end();
    let body = captured.body;
    if (body === undefined) {
      headers[OMITTED_BODY_HEADER] = '1';
      body = EMPTY;
    }
    if (this.#transaction !== undefined) return this.#commit({ status: captured.status, headers, body });
    const protocol = this.#protocol;
    try {
      const stored = await protocol.store.complete(
        this.key,
        this.#token,
        { status: captured.status, headers, body },
        o.ttlMs,
      );
      protocol.completed(this.key, stored, captured.status, this.#log);
    } catch (error) {
      // The response is sent all the same, as after any failed completion (even one the store goes on confirming).
      protocol.completeFailed(this.key, error, 'the response', this.#log);
    }
    return undefined;
  }

  async #commit(response: StoredResponse): Promise<StoredResponse | undefined> {
    const transaction = this.#transaction as StoreTransaction;
    try {
      const committed = await transaction.commit(response, this.#engine.options.ttlMs);
      this.#protocol.completed(this.key, committed, response.status, this.#log);
      if (committed) return undefined;
    } catch (error) {
      this.#protocol.commitFailed(this.key, error, this.#log);
      if (error instanceof CommitOutcomeUnknownError)
        return problemResponse(
          {
            type: PROBLEM_TYPES.commitUnknown,
            title: 'Commit outcome unknown',
            status: 503,
            detail:
              'The database did not confirm the commit: what the request did may or may not have been kept. Retry with the same key: it replays the response if it was, or runs again if not.',
          },
          { 'retry-after': '1' },
        );
    }
    return problemResponse(
      {
        type: PROBLEM_TYPES.transactionFailed,
        title: 'Transaction failed',
        status: 500,
        detail: 'The request was rolled back: nothing it did was kept. Retry with the same key.',
      },
      { 'retry-after': '1' },
    );
  }

  /**
   * The response's connection closed before the response was complete (the client left mid-response, a pipe into
   * it broke), after the handler had begun its answer and without an error. The one decision for every adapter:
   * the handler ran, so the request is recorded as executed without a body (a retry gets a 410 and never runs it
   * again), and the lease is no longer renewed. Never rejects.
   */
  async endedEarly(status: number, headers: Readonly<Record<string, OutgoingHeaderValue>>): Promise<void> {
    if (this.#settled) return;
    this.#log.debug(
      { key: this.key },
      'oncely: the response ended before it was complete; recorded as executed (a retry gets a 410)',
    );
    await this.complete({ status, headers, body: undefined });
  }

  /**
   * The adapter could not send the answer (the framework threw while writing it): the connection is closed by the
   * adapter, and the key is released unless the response was stored already. Logs one error line.
   */
  async sendFailed(error: unknown): Promise<void> {
    this.#log.error(
      { err: error, key: this.key },
      'oncely: the response could not be sent; the connection was closed',
    );
    await this.fail(error);
  }

  /** The handler threw (or the framework routed an error): release the key so a retry runs again. */
  async fail(error?: unknown): Promise<void> {
    if (this.#settle(this.#token !== undefined) || this.#token === undefined) return;
    if (error !== undefined)
      this.#log.debug({ err: error, key: this.key }, 'oncely: handler failed; releasing the key');
    await this.#release('error');
  }

  /**
   * The client left while the store was asked, before the handler ran (the adapter found its response destroyed,
   * its stream cancelled or its request's signal aborted when the store answered): release the key, reported with
   * the reason `'client-gone'`, so that the client's retry runs the handler. The adapter skips the handler.
   * Resolves to the answer for an adapter that must give one (a fetch handler): a 499 without a body, which goes
   * nowhere; 499 is what access logs commonly call a request whose client closed it.
   */
  async clientGone(): Promise<StoredResponse> {
    if (!this.#settle(this.#token !== undefined) && this.#token !== undefined) {
      this.#log.debug({ key: this.key }, 'oncely: the client left before the handler ran; releasing the key');
      await this.#release('client-gone');
    }
    return { status: 499, headers: {}, body: EMPTY };
  }

  /**
   * The adapter lost track of the handler: the framework gave it up (the client left, a timeout fired) while it
   * may still be running, and what is sent now is not its answer. Nothing is stored or released, since a retry
   * must not run beside it: the lease is no longer renewed and lapses after `lockTimeout`, as if the process had
   * died; a retry within it gets a 409, one after it runs again. Later `complete()` and `fail()` calls do nothing.
   * In transactional mode the transaction is rolled back instead (it holds a connection nothing would commit).
   */
  abandon(): void {
    if (this.#settled) return;
    if (this.#transaction !== undefined) {
      void this.fail(new Error('the handler was given up'));
      return;
    }
    this.#settle();
    this.#log.warn(
      { key: this.key },
      'oncely: the handler was given up before it finished; its key is left to lapse after lockTimeout',
    );
  }

  /**
   * Marks the execution settled: `true` when it was already. With `releasing` the lease and the context stay live
   * until `#release` (or `#end`) ends them, so that steps still running can be recorded before the key is free.
   */
  #settle(releasing = false): boolean {
    if (this.#settled) return true;
    this.#settled = true;
    if (!releasing) this.#end();
    return false;
  }

  /** Stops renewing the lease and refuses later steps. */
  #end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#lease?.stop();
    if (this.#context !== undefined) ExecutionContext.finish(this.#context);
    this.#protocol.hooks.executionEnded(this.key, this.#log);
  }

  async #release(reason: ReleaseEvent['reason'], status?: number): Promise<void> {
    // Steps still running (beside one that threw, under Promise.all) are recorded first, the lease renewed
    // meanwhile, at most lockTimeout: otherwise the retry would run them again.
    if (!this.#ended && this.#context !== undefined) await ExecutionContext.finishAfterSteps(this.#context);
    this.#end();
    const protocol = this.#protocol;
    if (this.#transaction !== undefined) {
      await protocol.rollBack(this.#transaction, this.key, reason, status, this.#log);
      return;
    }
    try {
      const released = await protocol.store.release(this.key, this.#token as string);
      protocol.released(this.key, released, reason, status, this.#log);
    } catch (error) {
      protocol.releaseFailed(this.key, error, this.#log);
    }
  }
}

const EMPTY = new Uint8Array(0);

/** What Node's `writeHead` accepts as a status (it throws ERR_HTTP_INVALID_STATUS_CODE for anything else). */
function isValidStatus(status: unknown): status is number {
  return typeof status === 'number' && Number.isInteger(status) && status >= 100 && status <= 999;
}

function internalErrorResponse(): StoredResponse {
  return problemResponse({
    type: PROBLEM_TYPES.internal,
    title: 'Idempotency check failed',
    status: 500,
    detail: 'The server could not decide whether its response may be replayed. Retry with the same key.',
  });
}
