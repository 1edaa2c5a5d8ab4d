import { CommitOutcomeUnknownError } from '../shared/errors';

/** How deep `cause` / `driverError` links are followed: wrappers nest one or two deep, a cycle must not hang. */
const MAX_DEPTH = 8;

/**
 * Whether the database answered a failed COMMIT, as far as the error shows: `isServerError` (the store's test for
 * an error its database sent) is asked of `error` and of what it wraps (`cause`, TypeORM's `driverError`), since
 * query builders and ORMs wrap the driver's error (Prisma's driver adapters: the server's code as the `originalCode`
 * of their error's `cause`).
 */
function serverAnswered(error: unknown, isServerError: (error: object) => boolean): boolean {
  let current: unknown = error;
  for (let depth = 0; depth < MAX_DEPTH && typeof current === 'object' && current !== null; depth++) {
    if (isServerError(current)) return true;
    const { cause, driverError } = current as { cause?: unknown; driverError?: unknown };
    current = driverError ?? cause;
  }
  return false;
}

/**
 * What a store throws for a COMMIT that failed with `error`: `error` itself when the database answered it (it
 * rolled back: nothing was kept), or `CommitOutcomeUnknownError` otherwise (the connection lost, a client-side
 * timeout, or an error that does not say): the database may have committed, and only a retry with the key can tell.
 */
export function commitFailure(
  error: unknown,
  store: { library: string; key: string; isServerError: (error: object) => boolean },
): unknown {
  if (serverAnswered(error, store.isServerError)) return error;
  return new CommitOutcomeUnknownError(
    `${store.library}: the COMMIT for key ${JSON.stringify(store.key)} got no answer; it may have committed.`,
    { cause: error },
  );
}
