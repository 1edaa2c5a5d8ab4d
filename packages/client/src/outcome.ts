/** How one attempt ended. `durationMs` runs from sending the request to its response headers (or the failure). */
export type AttemptOutcome =
  | {
      attempt: number;
      kind: 'response';
      status: number;
      /** The response's `Retry-After` in milliseconds, as sent (before `maxRetryAfter`); undefined without one. */
      retryAfterMs: number | undefined;
      durationMs: number;
    }
  | {
      attempt: number;
      /** No response headers within `timeout` (or within what was left of `deadline`). */
      kind: 'timeout';
      durationMs: number;
    }
  | {
      attempt: number;
      /** fetch rejected: refused, reset or dropped connection, DNS failure. The request may or may not have run. */
      kind: 'network-error';
      error: unknown;
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
