import { type ReplayableBody, replayableBody } from './body';
import { backoff, parseRetryAfter, sleep } from './delays';
import { type GiveUpReason, IdempotentFetchError, IdempotentFetchOptionsError } from './errors';
import { checkKey, newKey } from './key';
import { type IdempotentFetchOptions, type ResolvedOptions, resolveOptions } from './options';
import type { AttemptOutcome } from './outcome';

/** fetch's `init`, plus the key of this one call. */
export interface IdempotentRequestInit extends RequestInit {
  /**
   * The Idempotency-Key for this call, sent on each of its attempts, instead of a new random one. Give it when the
   * operation can outlive the call (the key persisted with a pending order, then retried after a reload).
   */
  key?: string;
}

/** A function with fetch's signature that sends an Idempotency-Key and retries safely. */
// `Request | string | URL` is DOM's `RequestInfo | URL`, spelled out: Node's types have no `RequestInfo`.
export type IdempotentFetch = (
  input: Request | string | URL,
  init?: IdempotentRequestInit,
) => Promise<Response>;

type AttemptResult = {
  outcome: AttemptOutcome;
  response: Response | undefined;
  /** Stops forwarding the caller's abort to this attempt (kept while the caller reads the body it gets). */
  detach: () => void;
};

/**
 * Returns a fetch that, for a covered method (POST, PUT, PATCH by default) without an Idempotency-Key header, adds
 * one and keeps it for every attempt of the call; it retries network errors, attempts that time out and retryable
 * statuses (409, 425, 429, 502, 503, 504) with exponential backoff and full jitter, honouring `Retry-After`, until
 * `maxAttempts` or `deadline`, and then rejects with an `IdempotentFetchError` listing every attempt. Options are
 * checked here, once.
 */
export function idempotentFetch(options?: IdempotentFetchOptions): IdempotentFetch {
  const o = resolveOptions(options);
  return (input, init) => call(o, input, init);
}

function isRequest(input: unknown): input is Request {
  return typeof Request !== 'undefined' && input instanceof Request;
}

function isStream(body: unknown): boolean {
  return typeof ReadableStream !== 'undefined' && body instanceof ReadableStream;
}

async function call(
  o: ResolvedOptions,
  input: Request | string | URL,
  init: IdempotentRequestInit | undefined,
): Promise<Response> {
  const startedAt = Date.now();
  const { key: givenKey, signal: initSignal, ...requestInit } = init ?? {};
  const signal = initSignal ?? (isRequest(input) ? input.signal : undefined) ?? undefined;
  signal?.throwIfAborted();

  // One template holds the normalized request (URL, method, headers, credentials, mode...); each attempt is a copy
  // of it with the replayable body and a signal of its own. A stream body is read here rather than through the
  // template: not every browser's Request takes a stream body (Firefox would send "[object ReadableStream]").
  const streamBody = isStream(requestInit.body)
    ? (requestInit.body as ReadableStream<Uint8Array>)
    : undefined;
  const template = new Request(input, streamBody ? { ...requestInit, body: undefined } : requestInit);
  const method = template.method.toUpperCase();

  const headerKey = template.headers.get(o.header);
  let key: string | undefined;
  if (givenKey !== undefined) {
    key = checkKey(givenKey);
    if (headerKey !== null && headerKey !== key)
      throw new IdempotentFetchOptionsError(
        'key',
        `oncely: the request has an ${o.header} header (${JSON.stringify(headerKey)}) and a different key ` +
          `option (${JSON.stringify(key)}); give one of them`,
      );
  } else if (headerKey !== null) {
    key = headerKey;
  } else if (o.methods.has(method)) {
    key = newKey();
  }
  if (key !== undefined && headerKey === null) template.headers.set(o.header, key);
  // A browser drops every header but a few from a no-cors request, the key among them, and hides the answer's
  // status: the retries would go without a key, and could run the operation again.
  if (key !== undefined && template.mode === 'no-cors')
    throw new IdempotentFetchOptionsError(
      'mode',
      `oncely: a request with mode 'no-cors' cannot carry an ${o.header} (browsers drop the header, so a retry could run the operation twice); send it with mode 'cors' and list ${o.header} in the server's Access-Control-Allow-Headers`,
    );

  // Retrying is safe with a key (the server runs the operation once), or for a method HTTP defines as idempotent.
  const retryable = key !== undefined || o.idempotentMethods.has(method);
  const body = await replayableBody(template, streamBody ?? requestInit.body, o.maxBodyBytes, signal);
  const send = o.fetch ?? globalThis.fetch; // called unbound: browsers throw "Illegal invocation" on another `this`
  const deadlineAt = startedAt + o.deadline;
  const attempts: AttemptOutcome[] = [];

  for (let attempt = 1; ; attempt++) {
    const timeout = Math.min(o.timeout, deadlineAt - Date.now());
    const { outcome, response, detach } = await sendOnce(send, template, body, attempt, timeout, signal);
    attempts.push(outcome);
    // A replayed answer is final, whatever its status: the operation ran once and answered that (a handler's own
    // 409 or 429, stored); retrying would get the same replay until the attempts ran out.
    if (
      response !== undefined &&
      (!retryable ||
        !o.retryOn.has(response.status) ||
        response.headers.get('idempotent-replayed') === 'true')
    )
      return signal === undefined ? response : detachedWhenRead(response, detach);
    detach();

    const retryAfter = outcome.kind === 'response' ? outcome.retryAfterMs : undefined;
    const delayMs = Math.max(
      backoff(attempt, o.baseDelay, o.maxDelay, o.random),
      Math.min(retryAfter ?? 0, o.maxRetryAfter),
    );
    let reason: GiveUpReason | undefined;
    if (!retryable) reason = 'not-retryable';
    else if (attempt >= o.maxAttempts) reason = 'max-attempts';
    else if (outcome.kind === 'timeout' && timeout < o.timeout)
      reason = 'deadline'; // cut short by it
    else if (Date.now() + delayMs >= deadlineAt) reason = 'deadline';
    if (reason !== undefined)
      throw new IdempotentFetchError({
        reason,
        key,
        method,
        url: template.url,
        attempts,
        response,
      });

    // Free the connection: an unread body would hold it until it is garbage collected.
    response?.body?.cancel().catch(() => {});
    o.onRetry?.({ key, method, url: template.url, attempt: attempt + 1, delayMs, previous: outcome });
    await sleep(delayMs, signal);
  }
}

/**
 * The response the caller gets when it gave a signal: its abort still reaches the body while the body is read (as
 * with fetch), and our listener on the signal goes once the body is done (read to the end, cancelled or failed),
 * not when the signal does: a signal shared by many calls (an app's shutdown signal) would otherwise gather one
 * listener, and the request it holds, per call. The body is passed through a stream of our own to see its end;
 * `url`, `redirected` and `type` are the original's.
 */
function detachedWhenRead(response: Response, detach: () => void): Response {
  const source = response.body;
  if (source === null) {
    detach();
    return response;
  }
  const reader = source.getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const chunk = await reader.read();
        if (chunk.done) {
          detach();
          controller.close();
        } else controller.enqueue(chunk.value);
      } catch (error) {
        detach();
        controller.error(error);
      }
    },
    cancel(reason) {
      detach();
      return reader.cancel(reason);
    },
  });
  const passed = new Response(body, {
    status: response.status,
    statusText: response.statusText,
    headers: response.headers,
  });
  Object.defineProperties(passed, {
    url: { value: response.url },
    redirected: { value: response.redirected },
    type: { value: response.type },
  });
  return passed;
}

async function sendOnce(
  send: (request: Request) => Promise<Response>,
  template: Request,
  body: ReplayableBody,
  attempt: number,
  timeout: number,
  signal: AbortSignal | undefined,
): Promise<AttemptResult> {
  const controller = new AbortController();
  const request = new Request(template, { body, signal: controller.signal });
  // Node's fetch (undici) makes the signal of the Request it sends follow ours through a weak reference that our
  // Request holds: were our Request collected mid-flight, no abort would reach the fetch. Whatever can abort the
  // attempt (the timer, the caller's signal) holds it, so it lives exactly as long as an abort can come.
  const abortAttempt = (reason: unknown): Request => {
    controller.abort(reason);
    return request;
  };
  const forwardAbort = () => abortAttempt(signal?.reason);
  signal?.addEventListener('abort', forwardAbort, { once: true });
  const detach = () => signal?.removeEventListener('abort', forwardAbort);
  let timedOut = false;
  const timer = Number.isFinite(timeout)
    ? setTimeout(
        () => {
          timedOut = true;
          abortAttempt(
            new DOMException(`oncely: no response within ${Math.round(timeout)} ms`, 'TimeoutError'),
          );
        },
        Math.max(0, timeout),
      )
    : undefined;
  const sentAt = Date.now();
  try {
    const response = await send(request);
    const durationMs = Date.now() - sentAt;
    const retryAfterMs = parseRetryAfter(response.headers.get('retry-after'), Date.now());
    return {
      outcome: { attempt, kind: 'response', status: response.status, retryAfterMs, durationMs },
      response,
      detach,
    };
  } catch (error) {
    detach();
    if (signal?.aborted) throw signal.reason;
    const durationMs = Date.now() - sentAt;
    if (timedOut) return { outcome: { attempt, kind: 'timeout', durationMs }, response: undefined, detach };
    return { outcome: { attempt, kind: 'network-error', error, durationMs }, response: undefined, detach };
  } finally {
    clearTimeout(timer);
  }
}
