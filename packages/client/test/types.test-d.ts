// Type tests: this file is not run, only compiled (`npm run typecheck` includes test/). Each `@ts-expect-error`
// fails the type check when the line under it compiles.
import { type IdempotentFetchOptions, idempotentFetch } from '../src/index';

export function durations(fromConfig: string): void {
  idempotentFetch({ timeout: '5s', deadline: '1 m', baseDelay: 250, maxDelay: '10s', maxRetryAfter: '30s' });
  // @ts-expect-error not a unit the server's durations know
  const day: IdempotentFetchOptions = { deadline: '1 day' };
  // @ts-expect-error a string of unknown content is not a duration
  const configured: IdempotentFetchOptions = { timeout: fromConfig };
  void [day, configured];
}
