/** `Retry-After` (RFC 9110, section 10.2.3), seconds or an HTTP date, in milliseconds from `now`; undefined if absent or invalid. */
export function parseRetryAfter(value: string | null, now: number): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, date - now);
}

/**
 * Exponential backoff with full jitter: a delay drawn evenly from [0, min(maxDelay, baseDelay · 2^(retry−1))]. Full
 * jitter spreads clients that failed together (one server restart) across the whole window, instead of bringing
 * them back together. `retry` is 1 for the first retry.
 */
export function backoff(retry: number, baseDelay: number, maxDelay: number, random: () => number): number {
  const ceiling = Math.min(maxDelay, baseDelay * 2 ** (retry - 1));
  return Math.floor(Math.min(1, Math.max(0, random())) * ceiling);
}

/** Waits `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
