import type { StoredResponse } from '../stores/store';

/** Stable `type` URIs of the problem details oncely answers with (RFC 9457). Documented in docs/errors.md. */
export const PROBLEM_TYPES = {
  keyMissing: 'https://oncely.dev/problems/key-missing',
  keyInvalid: 'https://oncely.dev/problems/key-invalid',
  inProgress: 'https://oncely.dev/problems/request-in-progress',
  mismatch: 'https://oncely.dev/problems/key-reused',
  storeUnavailable: 'https://oncely.dev/problems/store-unavailable',
  responseNotStored: 'https://oncely.dev/problems/response-not-stored',
  internal: 'https://oncely.dev/problems/internal-error',
  transactionFailed: 'https://oncely.dev/problems/transaction-failed',
  bodyUnreadable: 'https://oncely.dev/problems/body-unreadable',
  conflictingRegistrations: 'https://oncely.dev/problems/conflicting-registrations',
} as const;

export interface ProblemDetails {
  type: string;
  title: string;
  status: number;
  detail: string;
  [extension: string]: unknown;
}

/** A problem+json response ready to send; `extraHeaders` are added (e.g. `retry-after`). */
export function problemResponse(
  problem: ProblemDetails,
  extraHeaders?: Record<string, string>,
): StoredResponse {
  const body = Buffer.from(JSON.stringify(problem));
  return {
    status: problem.status,
    headers: {
      'content-type': 'application/problem+json',
      'content-length': String(body.byteLength),
      ...extraHeaders,
    },
    body,
  };
}
