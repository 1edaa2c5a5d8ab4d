import { type Duration, parseDuration } from '../shared/duration';

/** How much one purge of expired records deletes (SQL stores' `purgeExpired`). */
export interface PurgeOptions {
  /** Rows deleted per statement; small batches keep each delete's locks short. Default: `1000`. */
  batchSize?: number;
  /** Stop after this many batches (the reaper runs again later). Default: `100`. */
  maxBatches?: number;
}

export interface ReaperOptions extends PurgeOptions {
  /** How often the reaper runs. Default: `'1m'`. */
  interval?: Duration;
  /** Called with a reaper failure (the reaper keeps running). Default: ignored. */
  onError?: (error: unknown) => void;
}

/** A running reaper, as `startReaper()` returns it. */
export interface Reaper {
  /** Stops the reaper; resolves once a run under way has finished. */
  stop(): Promise<void>;
}

/**
 * Runs `purge(options)` every `interval` (timer `unref`'d, one run at a time, a failure passed to `onError`) until
 * `stop()`, which resolves once a run under way has finished. A SQL store's `startReaper`.
 */
export function startReaper(
  purge: (options: PurgeOptions) => Promise<unknown>,
  options: ReaperOptions,
): Reaper {
  const intervalMs = parseDuration(options.interval ?? '1m');
  let running: Promise<unknown> = Promise.resolve();
  let stopped = false;
  const timer = setInterval(() => {
    running = running
      .then(() => (stopped ? 0 : purge(options)))
      .catch((error: unknown) => options.onError?.(error));
  }, intervalMs);
  timer.unref();
  return {
    stop: async () => {
      stopped = true;
      clearInterval(timer);
      await running;
    },
  };
}
