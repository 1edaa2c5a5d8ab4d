/** How one attempt ended. `durationMs` runs from sending the request to its response headers (or the failure). */
export type AttemptOutcome =
  | {
      /** The attempt's number: 1 for the first. */
      attempt: number;
      /** A response arrived. */
      kind: 'response';
      /** The response's status. */
      status: number;
      /** The response's `Retry-After` in milliseconds, as sent (before `maxRetryAfter`); undefined without one. */
      retryAfterMs: number | undefined;
      /** From sending the request to its response headers, in milliseconds. */
      durationMs: number;
    }
  | {
      /** The attempt's number: 1 for the first. */
      attempt: number;
      /** No response headers within `timeout` (or within what was left of `deadline`). */
      kind: 'timeout';
      /** From sending the request until the attempt timed out, in milliseconds. */
      durationMs: number;
    }
  | {
      /** The attempt's number: 1 for the first. */
      attempt: number;
      /** fetch rejected: refused, reset or dropped connection, DNS failure. The request may or may not have run. */
      kind: 'network-error';
      /** What fetch rejected with. */
      error: unknown;
      /** From sending the request until fetch rejected, in milliseconds. */
      durationMs: number;
    };

/** One line per outcome, for error messages: `1: 409 (Retry-After 1000 ms)`, `2: timeout after 500 ms`. */
export function describeOutcome(outcome: AttemptOutcome): string {
  switch (outcome.kind) {
    case 'response':
      return `${outcome.attempt}: ${outcome.status}${
        outcome.retryAfterMs === undefined ? '' : ` (Retry-After ${outcome.retryAfterMs} ms)`
      }`;
    case 'timeout':
      return `${outcome.attempt}: timeout after ${outcome.durationMs} ms`;
    case 'network-error': {
      // Node's fetch says "fetch failed" and puts the reason (ECONNREFUSED, a reset) in `cause`.
      const { error } = outcome;
      const cause = messageOf((error as { cause?: unknown } | null)?.cause);
      return `${outcome.attempt}: network error: ${messageOf(error) ?? String(error)}${cause ? ` (${cause})` : ''}`;
    }
  }
}

// Duck-typed: errors may come from another realm (an iframe, a test sandbox), where `instanceof Error` is false.
function messageOf(value: unknown): string | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  const { message, code } = value as { message?: unknown; code?: unknown };
  if (typeof message === 'string' && message !== '') return message;
  return typeof code === 'string' ? code : undefined;
}
