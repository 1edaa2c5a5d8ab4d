import assert from 'node:assert/strict';
import type { AcquiredResult, AcquireResult, IdempotencyStore, StoredResponse } from '@oncely/core';
import { onTime, type Within } from './timing';

type RecordStep = NonNullable<IdempotencyStore['recordStep']>;
type Steps = Readonly<Record<string, string>>;

/** What the steps tests need from the suite around them. */
export interface StepsContext {
  test(name: string, body: () => Promise<void>): unknown;
  /** The store under test, once `before` created it. */
  store(): IdempotencyStore;
  /** A fresh random key. */
  key(label?: string): string;
  shortMs: number;
  /** Says once that the store has no `recordStep`, so that these tests checked nothing. */
  noteSkipped(): void;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const sleepUntil = (at: number) => sleep(Math.max(0, at - Date.now()));
const LONG = 60_000;
const lease = (fingerprint: string, lockTimeoutMs = 30_000) => ({ fingerprint, lockTimeoutMs });
const response: StoredResponse = { status: 200, headers: {}, body: new Uint8Array([1, 2, 3]) };

function acquired(result: AcquireResult, what = 'acquire'): AcquiredResult {
  if (result.status !== 'acquired') assert.fail(`${what}: expected acquired, got ${result.status}`);
  return result;
}

/** The steps an answer or record carries, as a plain object (absent and empty are the same). */
function stepsOf(carrier: { steps?: Steps } | undefined): Record<string, string> {
  return Object.fromEntries(Object.entries(carrier?.steps ?? {}));
}

/** An object of `[name, value]` pairs: no literal, so that names such as `__proto__` are own properties. */
const stepsFrom = (...pairs: [string, string][]): Record<string, string> => Object.fromEntries(pairs);

/** A resumed answer: a new token, the steps and the fingerprint the record kept. */
function assertResumed(
  result: AcquireResult,
  expected: { steps: Record<string, string>; fingerprint: string; notToken: string[] },
): AcquiredResult {
  const resumed = acquired(result, 'acquire of a record with steps');
  assert.deepEqual(stepsOf(resumed), expected.steps, 'acquire did not hand back the recorded steps');
  assert.equal(
    resumed.fingerprint,
    expected.fingerprint,
    "acquire must answer the record's kept fingerprint, not the one it was given",
  );
  for (const token of expected.notToken)
    assert.notEqual(resumed.token, token, 'a token was handed out twice');
  return resumed;
}

/**
 * The tests of `recordStep` and the `released` state: fencing, resuming a released record or one whose lease ran
 * out, expiry, `complete` dropping steps, and `get`, `delete` and `waitFor` on such records. On a store without
 * `recordStep` each passes at once, and the suite says so once.
 */
export function stepsTests(context: StepsContext): void {
  const { key, shortMs } = context;

  // A body that times a window with `within` is run again, on fresh keys, when it was late.
  const stepsTest = (
    name: string,
    body: (store: IdempotencyStore, recordStep: RecordStep, within: Within) => Promise<void>,
  ): void => {
    context.test(name, async () => {
      const store = context.store();
      if (store.recordStep === undefined) {
        context.noteSkipped();
        return;
      }
      const recordStep = store.recordStep.bind(store);
      await onTime((within) => body(store, recordStep, within));
    });
  };

  /** Acquires `k` with a lease of `shortMs` and records step `a` into it before the lease can have run out. */
  const shortLeaseWithStep = (within: Within, store: IdempotencyStore, recordStep: RecordStep, k: string) =>
    within('a step within the lease', shortMs, async () => {
      const owner = acquired(await store.acquire(k, lease('fp-1', shortMs)));
      assert.equal(await recordStep(k, owner.token, 'a', '"A"', LONG), true);
      return owner;
    });

  stepsTest(
    'recordStep acts only for the owner of a live lease: not another token, nor after release or complete',
    async (store, recordStep) => {
      const k = key();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"1"', LONG), true);
      assert.equal(
        await recordStep(k, `${first.token}-not`, 'b', '"2"', LONG),
        false,
        'another token recorded a step',
      );
      assert.equal(await store.release(k, first.token), true);
      assert.equal(
        await recordStep(k, first.token, 'c', '"3"', LONG),
        false,
        'a released token recorded a step',
      );
      const next = await store.acquire(k, lease('fp-2'));
      assertResumed(next, { steps: stepsFrom(['a', '"1"']), fingerprint: 'fp-1', notToken: [first.token] });

      const done = key('done');
      const owner = acquired(await store.acquire(done, lease('fp-1')));
      assert.equal(await recordStep(done, owner.token, 'a', '"1"', LONG), true);
      assert.equal(await store.complete(done, owner.token, response, LONG), true);
      assert.equal(
        await recordStep(done, owner.token, 'b', '"2"', LONG),
        false,
        'a completed token recorded a step',
      );
      assert.equal((await store.acquire(done, lease('fp-1'))).status, 'completed');

      // A key nobody holds: nothing to record into, and nothing written.
      const free = key('free');
      assert.equal(await recordStep(free, 'no-such-token', 'a', '"1"', LONG), false);
      assert.deepEqual(stepsOf(acquired(await store.acquire(free, lease('fp-1')))), {});
    },
  );

  stepsTest(
    'recordStep: a released record with steps is resumed by the next acquire, with its fingerprint and steps',
    async (store, recordStep) => {
      const k = key();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', LONG), true);
      assert.equal(await recordStep(k, first.token, 'b', '{"n":2}', LONG), true);
      assert.equal(await store.release(k, first.token), true);
      const second = assertResumed(await store.acquire(k, lease('fp-2')), {
        steps: stepsFrom(['a', '"A"'], ['b', '{"n":2}']),
        fingerprint: 'fp-1',
        notToken: [first.token],
      });
      // Resumed means held again, under the kept fingerprint: the resuming acquire's own was not stored.
      const during = await store.acquire(k, lease('fp-3'));
      if (during.status !== 'in_progress') assert.fail(`expected in_progress, got ${during.status}`);
      assert.equal(
        during.fingerprint,
        'fp-1',
        "the resuming acquire's fingerprint was stored over the kept one",
      );
      // The first token is fenced off for good.
      assert.equal(await recordStep(k, first.token, 'x', '"x"', LONG), false);
      assert.equal(await store.complete(k, first.token, response, LONG), false);
      assert.equal(await store.renew(k, first.token, 30_000), false);
      assert.equal(await store.release(k, first.token), false);
      // The new owner adds a step; released again, with or without a new step, the record keeps them all.
      assert.equal(await recordStep(k, second.token, 'c', '', LONG), true);
      assert.equal(await store.release(k, second.token), true);
      const all = stepsFrom(['a', '"A"'], ['b', '{"n":2}'], ['c', '']);
      const third = assertResumed(await store.acquire(k, lease('fp-4')), {
        steps: all,
        fingerprint: 'fp-1',
        notToken: [first.token, second.token],
      });
      assert.equal(await store.release(k, third.token), true);
      const fourth = assertResumed(await store.acquire(k, lease('fp-5')), {
        steps: all,
        fingerprint: 'fp-1',
        notToken: [first.token, second.token, third.token],
      });
      assert.equal(await store.complete(k, fourth.token, response, LONG), true);
      const done = await store.acquire(k, lease('fp-6'));
      if (done.status !== 'completed') assert.fail(`expected completed, got ${done.status}`);
      assert.equal(done.fingerprint, 'fp-1');
    },
  );

  stepsTest(
    'recordStep: a lease with steps that ran out is fenced off, then resumed with its fingerprint and steps',
    async (store, recordStep, within) => {
      const k = key();
      const first = await shortLeaseWithStep(within, store, recordStep, k);
      await sleep(shortMs * 3);
      // Nobody took it over yet: still not the old token's.
      assert.equal(
        await recordStep(k, first.token, 'b', '"B"', LONG),
        false,
        'a lease that ran out recorded a step',
      );
      assert.equal(await store.renew(k, first.token, 30_000), false, 'renew revived a lease that ran out');
      assert.equal(await store.complete(k, first.token, response, LONG), false);
      const second = assertResumed(await store.acquire(k, lease('fp-2')), {
        steps: stepsFrom(['a', '"A"']),
        fingerprint: 'fp-1',
        notToken: [first.token],
      });
      assert.equal(
        await recordStep(k, first.token, 'b', '"B"', LONG),
        false,
        'the old token recorded after a takeover',
      );
      assert.equal(await store.release(k, first.token), false);
      assert.equal(await recordStep(k, second.token, 'b', '"B2"', LONG), true);
      assert.equal(await store.complete(k, second.token, response, LONG), true);
      const done = await store.acquire(k, lease('fp-3'));
      if (done.status !== 'completed') assert.fail(`expected completed, got ${done.status}`);
      assert.equal(done.fingerprint, 'fp-1');
    },
  );

  stepsTest(
    "recordStep: a step's ttl shorter than the lease does not end the lease; released after it, the record is gone",
    async (store, recordStep) => {
      const k = key();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', shortMs), true);
      await sleep(shortMs * 3);
      const during = await store.acquire(k, lease('fp-2'));
      assert.equal(during.status, 'in_progress', "the step's ttl ended a live lease");
      assert.equal(await store.renew(k, first.token, 30_000), true);
      assert.equal(await recordStep(k, first.token, 'b', '"B"', shortMs), true);
      await sleep(shortMs * 3);
      // Kept until ttlMs after the latest step or the lease's end, whichever is later: the release is the later.
      assert.equal(await store.release(k, first.token), true);
      const next = acquired(await store.acquire(k, lease('fp-3')));
      assert.deepEqual(stepsOf(next), {}, 'a record released after its steps expired was resumed');
      assert.notEqual(next.token, first.token);
    },
  );

  stepsTest(
    'recordStep: complete drops the steps; once its ttl ran out the key starts afresh',
    async (store, recordStep, within) => {
      const k = key();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', LONG), true);
      await within('reads within the ttl', shortMs, async () => {
        assert.equal(await store.complete(k, first.token, response, shortMs), true);
        const done = await store.acquire(k, lease('fp-2'));
        if (done.status !== 'completed') assert.fail(`expected completed, got ${done.status}`);
        assert.equal(done.fingerprint, 'fp-1');
        if (store.get !== undefined) {
          const record = await store.get(k);
          assert.equal(record?.state, 'completed');
          assert.deepEqual(stepsOf(record), {}, 'a completed record still carries steps');
        }
      });
      await sleep(shortMs * 3);
      // The steps' own ttl (a minute) must not keep them: they went with complete.
      const fresh = acquired(await store.acquire(k, lease('fp-3')));
      assert.deepEqual(stepsOf(fresh), {}, 'steps came back after the completed record expired');
      assert.notEqual(fresh.token, first.token);
      if (store.get !== undefined) {
        const record = await store.get(k);
        assert.equal(record?.state, 'in_progress');
        assert.equal(record?.fingerprint, 'fp-3');
        assert.deepEqual(stepsOf(record), {});
      }
    },
  );

  stepsTest(
    'recordStep: a released record expires ttlMs after its latest step, then the key starts afresh',
    async (store, recordStep, within) => {
      const k = key();
      const ttl = shortMs * 6;
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', ttl), true);
      await sleep(shortMs * 3);
      let secondStepDone = 0;
      const second = await within("resume within the second step's ttl", ttl, async () => {
        const secondStepAt = Date.now();
        assert.equal(await recordStep(k, first.token, 'b', '"B"', ttl), true);
        secondStepDone = Date.now();
        assert.equal(await store.release(k, first.token), true);
        // Past the first step's ttl by 1.5 shortMs, 1.5 shortMs before the second's ends: the record is still kept.
        await sleepUntil(secondStepAt + shortMs * 4.5);
        return assertResumed(await store.acquire(k, lease('fp-2')), {
          steps: stepsFrom(['a', '"A"'], ['b', '"B"']),
          fingerprint: 'fp-1',
          notToken: [first.token],
        });
      });
      assert.equal(await store.release(k, second.token), true);
      // Well past the second step's ttl (and the lease's end, at the release just now).
      await sleepUntil(secondStepDone + shortMs * 9);
      const fresh = acquired(await store.acquire(k, lease('fp-3')));
      assert.deepEqual(stepsOf(fresh), {}, 'a released record outlived its ttl');
      if (store.get !== undefined) assert.equal((await store.get(k))?.fingerprint, 'fp-3');
    },
  );

  stepsTest(
    'recordStep: get shows the steps, and a record released or whose lease ran out as released',
    async (store, recordStep, within) => {
      if (store.get === undefined) return;
      const slack = Math.max(1_000, shortMs * 2);
      const k = key();
      const stepAt = Date.now();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', LONG), true);
      const held = await store.get(k);
      assert.equal(held?.state, 'in_progress');
      assert.equal(held?.token, first.token);
      assert.deepEqual(stepsOf(held), stepsFrom(['a', '"A"']));
      const releasing = Date.now();
      assert.equal(await store.release(k, first.token), true);
      const released = Date.now();
      const record = await store.get(k);
      assert.equal(record?.state, 'released');
      assert.equal(record?.fingerprint, 'fp-1');
      assert.deepEqual(stepsOf(record), stepsFrom(['a', '"A"']));
      const ended = record?.lockExpiresAt ?? Number.NaN;
      assert.ok(
        ended >= releasing - slack && ended <= released + slack,
        `lockExpiresAt ${ended} must be when the lease ended (released between ${releasing} and ${released})`,
      );
      const expires = record?.expiresAt ?? Number.NaN;
      assert.ok(
        expires >= stepAt + LONG - slack && expires <= released + LONG + slack,
        `expiresAt ${expires} must be ttlMs (${LONG}) after the step`,
      );
      const second = acquired(await store.acquire(k, lease('fp-2')));
      const resumed = await store.get(k);
      assert.equal(resumed?.state, 'in_progress');
      assert.equal(resumed?.token, second.token);
      assert.equal(resumed?.fingerprint, 'fp-1');
      assert.deepEqual(stepsOf(resumed), stepsFrom(['a', '"A"']));

      const lapsed = key('lapsed');
      await shortLeaseWithStep(within, store, recordStep, lapsed);
      await sleep(shortMs * 3);
      const ran = await store.get(lapsed);
      assert.equal(ran?.state, 'released', 'a lease with steps that ran out must read as released');
      assert.deepEqual(stepsOf(ran), stepsFrom(['a', '"A"']));
      assert.ok(
        (ran?.lockExpiresAt ?? Number.NaN) <= Date.now() + slack,
        'lockExpiresAt must be when the lease ended',
      );
    },
  );

  stepsTest('recordStep: delete removes a record with steps, released or held', async (store, recordStep) => {
    if (store.delete === undefined) return;
    for (const release of [true, false]) {
      const k = key(release ? 'released' : 'held');
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', LONG), true);
      if (release) assert.equal(await store.release(k, first.token), true);
      assert.equal(
        await store.delete(k),
        true,
        `delete did not find a ${release ? 'released' : 'held'} record with steps`,
      );
      assert.equal(await store.delete(k), false);
      if (store.get !== undefined) assert.equal(await store.get(k), undefined);
      const fresh = acquired(await store.acquire(k, lease('fp-2')));
      assert.deepEqual(stepsOf(fresh), {}, 'steps survived delete');
      assert.notEqual(fresh.token, first.token);
    }
  });

  stepsTest(
    'recordStep: waitFor wakes on the release of a record with steps, and does not wait on a released one',
    async (store, recordStep, within) => {
      if (store.waitFor === undefined) return;
      const k = key();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      assert.equal(await recordStep(k, first.token, 'a', '"A"', LONG), true);
      let woke = false;
      const waiting = store.waitFor(k, 20_000).then(() => {
        woke = true;
      });
      await sleep(shortMs);
      assert.equal(woke, false, 'waitFor resolved while the lease was live');
      assert.equal(await store.release(k, first.token), true);
      // Generous bounds: a waiter that only woke at its 20 s timeout fails them.
      const started = Date.now();
      await waiting;
      assert.ok(Date.now() - started < 10_000, 'waitFor did not wake on the release of a record with steps');
      const again = Date.now();
      await store.waitFor(k, 20_000);
      assert.ok(Date.now() - again < 10_000, 'waitFor waited on a released record, which nobody holds');

      const lapsed = key('lapsed');
      await shortLeaseWithStep(within, store, recordStep, lapsed);
      await sleep(shortMs * 3);
      const asked = Date.now();
      await store.waitFor(lapsed, 20_000);
      assert.ok(Date.now() - asked < 10_000, 'waitFor waited on a record whose lease ran out');
    },
  );

  stepsTest('recordStep: the same name again replaces its value', async (store, recordStep) => {
    const k = key();
    const first = acquired(await store.acquire(k, lease('fp-1')));
    assert.equal(await recordStep(k, first.token, 'a', '"1"', LONG), true);
    assert.equal(await recordStep(k, first.token, 'a', '"2"', LONG), true);
    assert.equal(await store.release(k, first.token), true);
    const second = assertResumed(await store.acquire(k, lease('fp-1')), {
      steps: stepsFrom(['a', '"2"']),
      fingerprint: 'fp-1',
      notToken: [first.token],
    });
    assert.equal(await recordStep(k, second.token, 'a', '"3"', LONG), true);
    assert.equal(await store.release(k, second.token), true);
    assertResumed(await store.acquire(k, lease('fp-1')), {
      steps: stepsFrom(['a', '"3"']),
      fingerprint: 'fp-1',
      notToken: [first.token, second.token],
    });
  });

  stepsTest(
    'recordStep: names and values come back as given (unicode, empty, 100 KB, names like __proto__)',
    async (store, recordStep) => {
      const big = JSON.stringify('ab€😀'.repeat(12_000)); // about 108 KB of UTF-8, 72,000 UTF-16 units
      const steps: [string, string][] = [
        ['plain', '{"id":"ch_1","amount":4200}'],
        ['ünïcödé 名前 🎉', '"héllo 世界 🎉"'],
        ['spaces {braces} "quotes" \\ / : *', '"\\u0000\\ud800\\n"'],
        ['undefined', ''],
        ['null', 'null'],
        ['0', '0'],
        ['__proto__', '{"polluted":true}'],
        ['constructor', '"c"'],
        ['toString', '"t"'],
        ['hasOwnProperty', '"h"'],
        ['n'.repeat(200), '"long name"'],
        ['big', big],
      ];
      const k = key();
      const first = acquired(await store.acquire(k, lease('fp-1')));
      for (const [name, value] of steps)
        assert.equal(await recordStep(k, first.token, name, value, LONG), true, name);
      if (store.get !== undefined) assert.deepEqual(stepsOf(await store.get(k)), stepsFrom(...steps));
      assert.equal(await store.release(k, first.token), true);
      const resumed = assertResumed(await store.acquire(k, lease('fp-1')), {
        steps: stepsFrom(...steps),
        fingerprint: 'fp-1',
        notToken: [first.token],
      });
      assert.equal(resumed.steps?.big?.length, big.length, 'the 100 KB value changed length');
    },
  );

  stepsTest('recordStep: 50 concurrent steps on one record all land', async (store, recordStep) => {
    const k = key();
    const first = acquired(await store.acquire(k, lease('fp-1')));
    const names = Array.from({ length: 50 }, (_, i) => `step-${i}`);
    const answers = await Promise.all(
      names.map((name) => recordStep(k, first.token, name, `"${name}"`, LONG)),
    );
    assert.deepEqual(
      answers,
      names.map(() => true),
    );
    assert.equal(await store.release(k, first.token), true);
    assertResumed(await store.acquire(k, lease('fp-1')), {
      steps: stepsFrom(...names.map((name): [string, string] => [name, `"${name}"`])),
      fingerprint: 'fp-1',
      notToken: [first.token],
    });
  });

  stepsTest(
    'recordStep: of 20 concurrent acquires of a released record with steps, or of a lease with steps that ran out, exactly one resumes it',
    async (store, recordStep, within) => {
      const released = key('released');
      const lapsed = key('lapsed');
      const releasing = acquired(await store.acquire(released, lease('fp-1')));
      assert.equal(await recordStep(released, releasing.token, 'a', '"A"', LONG), true);
      assert.equal(await store.release(released, releasing.token), true);
      await shortLeaseWithStep(within, store, recordStep, lapsed);
      await sleep(shortMs * 3);
      for (const k of [released, lapsed]) {
        const results = await Promise.all(Array.from({ length: 20 }, () => store.acquire(k, lease('fp-2'))));
        const winners = results.filter((r) => r.status === 'acquired');
        assert.equal(winners.length, 1, `${winners.length} acquires resumed one record`);
        assertResumed(winners[0] as AcquireResult, {
          steps: stepsFrom(['a', '"A"']),
          fingerprint: 'fp-1',
          notToken: [],
        });
        for (const r of results) {
          if (r.status === 'acquired') continue;
          if (r.status !== 'in_progress') assert.fail(`expected in_progress, got ${r.status}`);
          assert.equal(r.fingerprint, 'fp-1');
        }
      }
    },
  );

  stepsTest(
    'recordStep: steps belong to their key; a record without steps is still removed by release',
    async (store, recordStep) => {
      const withSteps = key('with');
      const without = key('without');
      const a = acquired(await store.acquire(withSteps, lease('fp-1')));
      const b = acquired(await store.acquire(without, lease('fp-1')));
      assert.equal(await recordStep(withSteps, a.token, 'a', '"A"', LONG), true);
      assert.equal(
        await recordStep(without, a.token, 'a', '"A"', LONG),
        false,
        "a token recorded into another key's record",
      );
      assert.equal(await store.release(withSteps, a.token), true);
      assert.equal(await store.release(without, b.token), true);
      if (store.get !== undefined)
        assert.equal(await store.get(without), undefined, 'a released record without steps was kept');
      const fresh = acquired(await store.acquire(without, lease('fp-2')));
      assert.deepEqual(stepsOf(fresh), {});
      assertResumed(await store.acquire(withSteps, lease('fp-2')), {
        steps: stepsFrom(['a', '"A"']),
        fingerprint: 'fp-1',
        notToken: [a.token],
      });
    },
  );
}
