import { undoAcquire } from '@oncely/core/adapter';
import { waitUntil } from '@oncely/testing';

describe('undoAcquire: releasing a lease behind an acquire that failed on the client', () => {
  test('retries until the release lands, then stops', async () => {
    const answers = [Promise.reject(new Error('server hung')), Promise.resolve(false), Promise.resolve(true)];
    for (const answer of answers) answer.catch(() => {});
    let calls = 0;
    undoAcquire(() => answers[calls++] ?? Promise.resolve(true), 60_000);
    await waitUntil(() => calls === 3, 'three release attempts', 5_000);
    await new Promise((resolve) => setTimeout(resolve, 1_200));
    expect(calls).toBe(3);
  });

  test('gives up once the lease would have lapsed, or when the store is closed', async () => {
    let calls = 0;
    undoAcquire(async () => {
      calls++;
      return false;
    }, 600);
    let closedCalls = 0;
    undoAcquire(
      async () => {
        closedCalls++;
        return false;
      },
      60_000,
      () => true,
    );
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    expect(calls).toBe(2); // now, and at 250 ms; the next (at 750 ms) would be past the 600 ms lease
    expect(closedCalls).toBe(1);
  });
});
