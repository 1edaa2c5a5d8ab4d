import assert from 'node:assert/strict';
import { debuglog } from 'node:util';

// Discarded attempts help in choosing shortMs, but are noise in a passing run: NODE_DEBUG=oncely-store-suite shows
// them.
const debug = debuglog('oncely-store-suite');

/** How many attempts `onTime` makes before it blames the machine. */
const ATTEMPTS = 5;

/** Thrown when a window overran: what its checks found proves nothing. */
class Late extends Error {}

/**
 * Runs `body`, whose checks rely on a lease or TTL of `ms` not having run out yet, timed from before its first call
 * to after its last answer. Within `ms`, it resolves or rejects as `body` does. Past `ms` (an event-loop stall, a
 * slow round trip), the lease or TTL may rightly have run out, so the attempt is discarded whatever `body` found.
 */
export type Within = <T>(what: string, ms: number, body: () => Promise<T>) => Promise<T>;

const within: Within = async (what, ms, body) => {
  const started = performance.now();
  const outcome = await body().then(
    (value) => ({ value }),
    (error: unknown) => ({ error }),
  );
  const took = performance.now() - started;
  // Stores count time in whole milliseconds, so a lease or TTL of `ms` may end up to 1 ms early.
  if (took > ms - 1) throw new Late(`${what}: ${Math.round(took)} ms, window ${ms} ms`);
  if ('error' in outcome) throw outcome.error;
  return outcome.value;
};

/**
 * Runs `attempt`, which must make fresh keys, until none of its `within` windows overran, up to five times. An
 * attempt on time passes or fails as it is; if every attempt was late, fails saying the machine was too slow.
 */
export async function onTime(attempt: (within: Within) => Promise<void>): Promise<void> {
  const delays: string[] = [];
  for (let i = 1; i <= ATTEMPTS; i++) {
    try {
      return await attempt(within);
    } catch (error) {
      if (!(error instanceof Late)) throw error;
      delays.push(error.message);
      debug('attempt %d of %d discarded, late: %s', i, ATTEMPTS, error.message);
    }
  }
  assert.fail(
    `the machine was too slow to check this: all ${ATTEMPTS} attempts were late (${delays.join('; ')})`,
  );
}
