import type { StoredResponse } from '../stores/store';

/** Stable `type` URIs of the problem details oncely answers with (RFC 9457). Documented in docs/errors.md. */
export const PROBLEM_TYPES = {
  /** 400: `required: true` and the request has no key header. */
  keyMissing: 'https://oncely.dev/problems/key-missing',
  /** 400: the key is empty, too long, not visible ASCII, a malformed RFC 8941 string, or sent more than once. */
  keyInvalid: 'https://oncely.dev/problems/key-invalid',
  /** 409 (or 429): a request with the same key is still running, or the wait for it ran out. */
  inProgress: 'https://oncely.dev/problems/request-in-progress',
  /** 422: the key was used by a request with a different fingerprint. */
  mismatch: 'https://oncely.dev/problems/key-reused',
  /** 503: the store failed on the first step with `onStoreError: 'fail-closed'`; the handler did not run. */
  storeUnavailable: 'https://oncely.dev/problems/store-unavailable',
  /** 410: a replay of a request that ran but whose response body was not stored; only its status was kept. */
  responseNotStored: 'https://oncely.dev/problems/response-not-stored',
  /** 500: `scope`, `fingerprint` or `cacheable` threw, or the response's status is impossible; nothing stored. */
  internal: 'https://oncely.dev/problems/internal-error',
  /** 500: transactional mode: the transaction holding the handler's writes and the record did not commit. */
  transactionFailed: 'https://oncely.dev/problems/transaction-failed',
  /** 503: transactional mode: the commit got no answer; a retry with the key replays it or runs again. */
  commitUnknown: 'https://oncely.dev/problems/commit-outcome-unknown',
  /** 400: the request's body stream failed while oncely read it for the fingerprint. */
  bodyUnreadable: 'https://oncely.dev/problems/body-unreadable',
  /** 500: a nested registration decides a request another one took first otherwise. */
  conflictingRegistrations: 'https://oncely.dev/problems/conflicting-registrations',
} as const;

/** A problem details object (RFC 9457), the body of each error answer oncely sends. */
export interface ProblemDetails {
  /** One of `PROBLEM_TYPES`. */
  type: string;
  /** A short, fixed summary of the problem type. */
  title: string;
  /** The response status. */
  status: number;
  /** What happened to this request, for people. */
  detail: string;
  /** Extension members, such as `originalStatus` on a `response-not-stored` answer. */
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
