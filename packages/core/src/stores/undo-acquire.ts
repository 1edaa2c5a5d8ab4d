/**
 * For a store whose `acquire` failed on the client (a timeout) while the server may still run it later (a paused
 * server, a slow network, a statement still queued on a dead connection): that would leave a lease nobody holds,
 * blocking retries of the key until `lockTimeoutMs` ends. `release` (fenced by the failed call's token, so it can
 * never remove anyone else's record) is tried now and again at growing intervals (0.25 s, 0.5 s, 1 s...) until it
 * removes the lease, the lease has lapsed by itself, or `stopped()` says the store was closed. Never throws; the
 * timers do not keep the process alive.
 */
export function undoAcquire(
  release: () => Promise<boolean>,
  lockTimeoutMs: number,
  stopped: () => boolean = () => false,
): void {
  const deadline = Date.now() + lockTimeoutMs;
  let delayMs = 250;
  const retryLater = (): void => {
    if (stopped() || Date.now() + delayMs > deadline) return;
    setTimeout(attempt, delayMs).unref();
    delayMs *= 2;
  };
  function attempt(): void {
    let pending: Promise<boolean>;
    try {
      pending = release();
    } catch {
      retryLater();
      return;
    }
    pending.then(
      (released) => {
        if (!released) retryLater();
      },
      () => retryLater(),
    );
  }
  attempt();
}
