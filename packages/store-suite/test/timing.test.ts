import assert from 'node:assert/strict';
import { onTime } from '../src/timing';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

test('a late attempt is discarded, and the next one, on time, decides', async () => {
  const outcomes: string[] = [];
  await onTime(async (within) => {
    const late = outcomes.length === 0;
    await within('the check', late ? 20 : 10_000, async () => {
      await sleep(late ? 60 : 0);
      outcomes.push(late ? 'late' : 'on time');
      // What a store may rightly answer once the window overran: it must not fail the test.
      if (late) assert.fail('the record expired');
    });
  });
  expect(outcomes).toEqual(['late', 'on time']);
});

test('an attempt on time fails the test with its own error, without another attempt', async () => {
  let attempts = 0;
  const run = onTime(async (within) => {
    attempts++;
    await within('the check', 10_000, async () => assert.fail('the store is wrong'));
  });
  await expect(run).rejects.toThrow('the store is wrong');
  expect(attempts).toBe(1);
});

test('a late attempt is discarded even when its checks passed', async () => {
  let attempts = 0;
  await onTime(async (within) => {
    attempts++;
    await within('the check', attempts === 1 ? 20 : 10_000, () => sleep(attempts === 1 ? 60 : 0));
  });
  expect(attempts).toBe(2);
});

test('when every attempt is late, the test fails saying the machine was too slow, with each delay', async () => {
  let attempts = 0;
  const run = onTime(async (within) => {
    attempts++;
    await within('the check', 10, () => sleep(40));
  });
  await expect(run).rejects.toThrow(
    /too slow.*all 5 attempts were late \((the check: \d+ ms, window 10 ms(; )?){5}\)/,
  );
  expect(attempts).toBe(5);
});
