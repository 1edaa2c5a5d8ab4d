/**
 * `pending`'s outcome, or the error `timeoutError()` makes once `timeoutMs` has passed first (`expire` is told it
 * just before): a later outcome of `pending` is then ignored. For store drivers whose statements have no client-side
 * deadline that holds against a hung server (postgres.js, mysql2's prepare step); the statement itself goes on.
 */
export function withinDeadline<T>(
  timeoutMs: number,
  pending: PromiseLike<T>,
  timeoutError: () => Error,
  expire?: (error: Error) => void,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      const error = timeoutError();
      // expire is the store's own clean-up: should it fail, that must neither throw out of a timer (a crashed
      // process) nor keep the call from settling.
      try {
        expire?.(error);
      } catch {}
      reject(error);
    }, timeoutMs);
    pending.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
