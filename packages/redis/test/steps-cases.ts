import { randomUUID } from 'node:crypto';
import type { AcquiredResult, AcquireResult } from '@oncely/core';
import type { RedisStore } from '../src';

/**
 * RedisStore's recorded steps (`recordStep`) and what a record carrying them changes in the other operations, as
 * store.ts's JSDoc of `recordStep` states them; run on a standalone server (steps.test.ts) and on a Cluster
 * (cluster.test.ts), through each client. `store()` is the store under test.
 */
export function stepCases(store: () => RedisStore): void {
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  const key = () => `steps ${randomUUID()} {tag}:é`;
  const acquired = (result: AcquireResult): AcquiredResult => {
    if (result.status !== 'acquired') throw new Error(`expected acquired, got ${result.status}`);
    return result;
  };
  const take = async (k: string, fingerprint = 'fp-1', lockTimeoutMs = 30_000) =>
    acquired(await store().acquire(k, { fingerprint, lockTimeoutMs }));

  test('a step is recorded under the live lease; get shows it, in progress', async () => {
    const k = key();
    const { token } = await take(k);
    expect(await store().recordStep(k, token, 'charge', '{"id":"ch_1"}', 60_000)).toBe(true);
    expect(await store().recordStep(k, token, 'email', '', 60_000)).toBe(true);
    const record = await store().get(k);
    expect(record).toMatchObject({ state: 'in_progress', fingerprint: 'fp-1', token });
    expect(record?.steps).toEqual({ charge: '{"id":"ch_1"}', email: '' });
  });

  test('names and values of any text come back as given; a name recorded again is replaced', async () => {
    const k = key();
    const { token } = await take(k, 'fp:ü');
    const values: Record<string, string> = {
      'a:b': '1:2:3',
      __proto__: '{"x":1}',
      'naïve 🍕': '"ünïcödé 🍕"',
      '12': ':',
      big: JSON.stringify('x'.repeat(100_000)),
    };
    for (const [name, value] of Object.entries(values)) {
      expect(await store().recordStep(k, token, name, value, 60_000)).toBe(true);
    }
    expect(await store().recordStep(k, token, 'a:b', '"replaced"', 60_000)).toBe(true);
    expect(await store().release(k, token)).toBe(true);
    const resumed = await take(k, 'fp:ü');
    const expected = Object.fromEntries(Object.entries({ ...values, 'a:b': '"replaced"' }));
    expect(Object.keys(resumed.steps ?? {}).sort()).toEqual(Object.keys(expected).sort());
    for (const [name, value] of Object.entries(expected)) {
      expect(Object.getOwnPropertyDescriptor(resumed.steps, name)?.value).toBe(value);
    }
  });

  test('release keeps a record with steps as released; acquire resumes it with a new token, its fingerprint and steps', async () => {
    const k = key();
    const first = await take(k, 'fp-first');
    await store().recordStep(k, first.token, 'one', '1', 60_000);
    expect(await store().release(k, first.token)).toBe(true);
    expect(await store().release(k, first.token)).toBe(false);
    const released = await store().get(k);
    expect(released).toMatchObject({ state: 'released', fingerprint: 'fp-first', steps: { one: '1' } });

    // Another fingerprint: the record keeps the first one, and the token carries it.
    const second = await take(k, 'fp-second');
    expect(second.token).not.toBe(first.token);
    expect(second.fingerprint).toBe('fp-first');
    expect(second.steps).toEqual({ one: '1' });
    expect((await store().get(k))?.state).toBe('in_progress');
    // The old token is fenced off; the new one records and completes.
    expect(await store().recordStep(k, first.token, 'two', 'old', 60_000)).toBe(false);
    expect(await store().recordStep(k, second.token, 'two', '2', 60_000)).toBe(true);
    expect((await store().get(k))?.steps).toEqual({ one: '1', two: '2' });
    const response = { status: 201, headers: { a: 'b' }, body: new Uint8Array([1, 2]) };
    expect(await store().complete(k, second.token, response, 60_000)).toBe(true);

    // Completed: steps dropped, the first fingerprint kept.
    const completed = await store().get(k);
    expect(completed?.state).toBe('completed');
    expect(completed?.steps).toBeUndefined();
    expect(completed?.fingerprint).toBe('fp-first');
    const replay = await store().acquire(k, { fingerprint: 'fp-first', lockTimeoutMs: 1000 });
    expect(replay).toMatchObject({ status: 'completed', fingerprint: 'fp-first' });
  });

  test('a held record with steps answers in_progress to another acquire, with its fingerprint and lease', async () => {
    const k = key();
    const { token } = await take(k, 'fp-held', 5000);
    await store().recordStep(k, token, 's', '1', 60_000);
    const other = await store().acquire(k, { fingerprint: 'fp-other', lockTimeoutMs: 1000 });
    expect(other.status).toBe('in_progress');
    if (other.status !== 'in_progress') return;
    expect(other.fingerprint).toBe('fp-held');
    expect(other.retryAfterMs).toBeGreaterThan(0);
    expect(other.retryAfterMs).toBeLessThanOrEqual(5000);
    // It changed nothing: the owner still records.
    expect(await store().recordStep(k, token, 't', '2', 60_000)).toBe(true);
  });

  test('a lease that runs out leaves the record released; the next acquire resumes it and fences the old owner', async () => {
    const k = key();
    const first = await take(k, 'fp', 150);
    await store().recordStep(k, first.token, 'charge', '"ch"', 60_000);
    await sleep(300);
    expect((await store().get(k))?.state).toBe('released');
    expect(await store().renew(k, first.token, 10_000)).toBe(false);
    const second = await take(k, 'fp');
    expect(second.steps).toEqual({ charge: '"ch"' });
    // The owner whose lease was taken over: every write refused, the record as the new owner has it.
    expect(await store().recordStep(k, first.token, 'email', '"late"', 60_000)).toBe(false);
    expect(await store().renew(k, first.token, 10_000)).toBe(false);
    expect(await store().release(k, first.token)).toBe(false);
    const response = { status: 200, headers: {}, body: new Uint8Array() };
    expect(await store().complete(k, first.token, response, 60_000)).toBe(false);
    const record = await store().get(k);
    expect(record).toMatchObject({ state: 'in_progress', token: second.token, steps: { charge: '"ch"' } });
  });

  test('a lapsed lease is not revived by renew or recordStep, even with nobody taking it over', async () => {
    const k = key();
    const { token } = await take(k, 'fp', 150);
    await store().recordStep(k, token, 'a', '1', 60_000);
    await sleep(300);
    expect(await store().recordStep(k, token, 'b', '2', 60_000)).toBe(false);
    expect(await store().renew(k, token, 10_000)).toBe(false);
    expect(await store().release(k, token)).toBe(false);
    expect((await store().get(k))?.steps).toEqual({ a: '1' });
  });

  test('renew moves the lease of a record with steps', async () => {
    const k = key();
    const { token } = await take(k, 'fp', 300);
    await store().recordStep(k, token, 'a', '1', 60_000);
    expect(await store().renew(k, token, 10_000)).toBe(true);
    await sleep(500);
    const record = await store().get(k);
    expect(record?.state).toBe('in_progress');
    expect(await store().recordStep(k, token, 'b', '2', 60_000)).toBe(true);
  });

  test('a released record with steps expires ttlMs after its latest step; then acquire starts afresh', async () => {
    const k = key();
    // A lease far longer than the steps' ttl: released, the record must expire with its steps, not its lease.
    const { token } = await take(k, 'fp-old');
    const ttlMs = 1_500;
    const before = Date.now();
    expect(await store().recordStep(k, token, 'a', '1', ttlMs)).toBe(true);
    const after = Date.now();
    expect(await store().release(k, token)).toBe(true);
    const released = await store().get(k);
    expect(released?.state).toBe('released');
    // ttlMs after the step, on Redis's clock (the same machine's; a few ms for the clocks' rounding).
    const expiresAt = released?.expiresAt ?? 0;
    expect(expiresAt).toBeGreaterThanOrEqual(before + ttlMs - 5);
    expect(expiresAt).toBeLessThanOrEqual(after + ttlMs + 5);
    await sleep(Math.max(0, expiresAt - Date.now()) + 50);
    expect(await store().get(k)).toBeUndefined();
    expect(await store().delete(k)).toBe(false);
    const fresh = await take(k, 'fp-new');
    expect(fresh.steps ?? {}).toEqual({});
    expect((await store().get(k))?.fingerprint).toBe('fp-new');
  });

  test('a record with steps lives to its lease end when that is later than the steps’ expiry', async () => {
    const k = key();
    // A lease far longer than the wait, so a loaded machine's slow turn cannot outlast it.
    const { token } = await take(k, 'fp', 10_000);
    await store().recordStep(k, token, 'a', '1', 50);
    await sleep(300);
    const record = await store().get(k);
    expect(record).toMatchObject({ state: 'in_progress', steps: { a: '1' } });
    // Kept to the lease end (give or take the ms between the script's clock reads).
    expect(Math.abs((record?.expiresAt ?? 0) - (record?.lockExpiresAt ?? 0))).toBeLessThanOrEqual(5);
    // Released now: the steps' expiry has passed, so the record is gone at once.
    expect(await store().release(k, token)).toBe(true);
    expect(await store().get(k)).toBeUndefined();
  });

  test('delete removes a record with steps, held or released', async () => {
    const k = key();
    const { token } = await take(k);
    await store().recordStep(k, token, 'a', '1', 60_000);
    expect(await store().release(k, token)).toBe(true);
    expect(await store().delete(k)).toBe(true);
    expect(await store().get(k)).toBeUndefined();
    expect((await take(k)).steps ?? {}).toEqual({});
  });

  test('waitFor: a released record with steps is not held; a held one wakes on release and on completion', async () => {
    const k = key();
    const { token } = await take(k);
    await store().recordStep(k, token, 'a', '1', 60_000);
    let woke = false;
    const waiting = store()
      .waitFor(k, 20_000)
      .then(() => {
        woke = true;
      });
    await sleep(200);
    expect(woke).toBe(false);
    expect(await store().release(k, token)).toBe(true);
    await waiting; // well before the 20 s timeout (jest's own timeout is shorter)
    await store().waitFor(k, 20_000); // released: at once

    const second = await take(k);
    const waitingAgain = store().waitFor(k, 20_000);
    await sleep(100);
    const response = { status: 200, headers: {}, body: new Uint8Array() };
    expect(await store().complete(k, second.token, response, 60_000)).toBe(true);
    await waitingAgain;
  }, 10_000);

  test('recordStep on a completed, missing or another token’s record is false and writes nothing', async () => {
    const k = key();
    expect(await store().recordStep(k, `${randomUUID()}fp`, 'a', '1', 60_000)).toBe(false);
    expect(await store().get(k)).toBeUndefined();
    const { token } = await take(k);
    expect(await store().recordStep(k, `${randomUUID()}fp-1`, 'a', '1', 60_000)).toBe(false);
    expect((await store().get(k))?.steps).toBeUndefined();
    const response = { status: 200, headers: {}, body: new Uint8Array() };
    expect(await store().complete(k, token, response, 60_000)).toBe(true);
    expect(await store().recordStep(k, token, 'a', '1', 60_000)).toBe(false);
    expect((await store().get(k))?.state).toBe('completed');
  });

  test('of many concurrent acquires of a released record with steps, exactly one resumes it', async () => {
    const k = key();
    const { token } = await take(k);
    await store().recordStep(k, token, 'a', '1', 60_000);
    await store().release(k, token);
    const results = await Promise.all(
      Array.from({ length: 20 }, () => store().acquire(k, { fingerprint: 'fp-1', lockTimeoutMs: 30_000 })),
    );
    const winners = results.filter((r) => r.status === 'acquired');
    expect(winners).toHaveLength(1);
    expect((winners[0] as AcquiredResult).steps).toEqual({ a: '1' });
    expect(results.filter((r) => r.status === 'in_progress')).toHaveLength(19);
  });
}
