import { Idempotency, type IdempotencyStore, type Logger, MemoryStore } from '@oncely/core';
import type { HttpDecision, HttpRequestInput } from '@oncely/core/adapter';

// What Execution decides for a response it cannot judge (an invalid status, a throwing cacheable) and for a
// response that ended before it was complete: the same for every adapter, which only reports what happened.

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function input(key: string): HttpRequestInput<unknown> {
  return { method: 'POST', url: '/charges', headers: { 'idempotency-key': key }, body: {}, request: {} };
}

function expectExecute(decision: HttpDecision) {
  if (decision.action !== 'execute') throw new Error(`expected execute, got ${decision.action}`);
  return decision.execution;
}

function recordingLogger(): Logger & { errors: string[] } {
  const errors: string[] = [];
  const none = () => {};
  return { errors, debug: none, info: none, warn: none, error: (_obj, msg) => void errors.push(msg ?? '') };
}

const headers = { 'content-type': 'application/json' };

describe('Execution.complete: a response it cannot judge fails the request', () => {
  test.each([
    ['an invalid status (undefined)', undefined as unknown as number, () => true],
    ['an invalid status (1000)', 1000, () => true],
    [
      'a cacheable that throws',
      201,
      () => {
        throw new TypeError('no rule for 201');
      },
    ],
  ])(
    '%s: a 500 problem instead of the answer, the key released, an error logged',
    async (_label, status, cacheable) => {
      const logger = recordingLogger();
      const engine = new Idempotency({ logger, cacheable });
      const execution = expectExecute(await engine.handle(input('k')));
      const replacement = await execution.complete({ status, headers, body: Buffer.from('{}') });
      expect(replacement?.status).toBe(500);
      expect(replacement?.headers['content-type']).toBe('application/problem+json');
      expect(JSON.parse(Buffer.from(replacement?.body ?? []).toString()).type).toBe(
        'https://oncely.dev/problems/internal-error',
      );
      expect(logger.errors).toHaveLength(1);
      // Released: the next request with the key runs the handler.
      expect((await engine.handle(input('k'))).action).toBe('execute');
    },
  );
});

describe('Execution.endedEarly: a response cut short is recorded as executed', () => {
  test('the retry gets a 410, and the lease is no longer renewed', async () => {
    const memory = new MemoryStore();
    let renewals = 0;
    const store: IdempotencyStore = {
      acquire: (k, o) => memory.acquire(k, o),
      complete: (k, t, r, ttl) => memory.complete(k, t, r, ttl),
      release: (k, t) => memory.release(k, t),
      renew: (k, t, ms) => {
        renewals++;
        return memory.renew(k, t, ms);
      },
    };
    const engine = new Idempotency({ store, lockTimeout: 60 });
    const execution = expectExecute(await engine.handle(input('cut')));
    await sleep(100);
    expect(renewals).toBeGreaterThan(0);
    await execution.endedEarly(200, headers);
    const after = renewals;
    const retry = await engine.handle(input('cut'));
    expect(retry.action === 'respond' && retry.response.status).toBe(410);
    // A later complete() of the same execution changes nothing.
    await execution.complete({ status: 200, headers, body: Buffer.from('late') });
    expect((await engine.handle(input('cut'))).action === 'respond').toBe(true);
    await sleep(200);
    expect(renewals).toBe(after);
    await memory.close();
  });
});
