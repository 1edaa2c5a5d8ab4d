import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

// The suite takes its runner's functions as arguments: here it runs under node:test, in a process without jest's
// globals, on a store that passes it and on one that must fail it.
const repositoryRoot = join(__dirname, '..', '..', '..');

/** Runs the suite under node:test; `only`: just the tests whose names match it. */
function runUnderNodeTest(
  env: Record<string, string>,
  only?: string,
): { status: number | null; output: string } {
  const fixture = join(__dirname, 'fixtures', 'node-test-run.ts');
  const pattern = only === undefined ? [] : [`--test-name-pattern=${only}`];
  const run = spawnSync(
    process.execPath,
    ['--import', 'tsx', '--conditions=@oncely/source', '--test', '--test-reporter=tap', ...pattern, fixture],
    { cwd: repositoryRoot, env: { ...process.env, ...env }, encoding: 'utf8', timeout: 60_000 },
  );
  return { status: run.status, output: `${run.stdout}${run.stderr}` };
}

const count = (output: string, what: 'pass' | 'fail'): number =>
  Number(new RegExp(`^# ${what} (\\d+)$`, 'm').exec(output)?.[1] ?? Number.NaN);

test('under node:test, MemoryStore passes every test of the suite', () => {
  const { status, output } = runUnderNodeTest({ BROKEN: '0' });
  expect({ status, fail: count(output, 'fail') }).toEqual({ status: 0, fail: 0 });
  expect(count(output, 'pass')).toBe(35);
});

test('under node:test, a store without recordStep passes, and the suite says its recordStep tests checked nothing', () => {
  const { status, output } = runUnderNodeTest({ BROKEN: 'no-steps' }, 'recordStep');
  expect({ status, fail: count(output, 'fail') }).toEqual({ status: 0, fail: 0 });
  expect(output).toContain(
    'MemoryStore without recordStep has no recordStep, so its recordStep tests checked nothing',
  );
});

const failedTests = (output: string): string[] =>
  [...output.matchAll(/^\s*not ok \d+ - (.+)$/gm)].map((match) => match[1] as string);

test("under node:test, a store whose resuming acquire answers the caller's fingerprint fails the steps tests", () => {
  const { status, output } = runUnderNodeTest({ BROKEN: 'step-fingerprint' }, 'recordStep');
  expect(status).not.toBe(0);
  expect(failedTests(output)).toEqual(
    expect.arrayContaining([
      'recordStep: a released record with steps is resumed by the next acquire, with its fingerprint and steps',
      'recordStep: a lease with steps that ran out is fenced off, then resumed with its fingerprint and steps',
    ]),
  );
});

test('under node:test, a store whose recordStep answers true to any token fails the fencing tests', () => {
  const { status, output } = runUnderNodeTest({ BROKEN: 'step-fencing' }, 'recordStep');
  expect(status).not.toBe(0);
  expect(failedTests(output)).toEqual(
    expect.arrayContaining([
      'recordStep acts only for the owner of a live lease: not another token, nor after release or complete',
      'recordStep: a lease with steps that ran out is fenced off, then resumed with its fingerprint and steps',
    ]),
  );
});

test('under node:test, a store whose release ignores the token fails the fencing tests', () => {
  const { status, output } = runUnderNodeTest({ BROKEN: '1' });
  expect(status).not.toBe(0);
  const failed = [...output.matchAll(/^\s*not ok \d+ - (.+)$/gm)].map((match) => match[1]);
  expect(failed).toEqual(
    expect.arrayContaining([
      'a wrong token can neither complete, release nor renew',
      'a completed record cannot be completed again, released or renewed',
      'an expired lease is taken over with a new token; the stale token is fenced off',
    ]),
  );
});

test('under node:test, a store whose in_progress answer overwrites the fingerprint fails the suite', () => {
  const { status, output } = runUnderNodeTest({ BROKEN: 'in-progress-writes' });
  expect(status).not.toBe(0);
  const failed = [...output.matchAll(/^\s*not ok \d+ - (.+)$/gm)].map((match) => match[1]);
  expect(failed).toContain(
    'an in_progress answer writes nothing: the holder keeps its fingerprint, lease and token',
  );
});
