// Middy's early response (a middleware answering from `before`, `after` or `onError`): Middy then runs no other
// middleware of any phase. Run in a process of its own (Middy is ESM-only, which jest cannot load):
// fixtures/http-middy-early.ts runs each case and prints what it gave. What is checked here is what
// docs/frameworks/lambda.md says happens.
import { join } from 'node:path';
import { type SourceProcess, spawnSource } from '@oncely/testing';
import type { Result } from './http-nested-cases';

jest.setTimeout(60_000);

/**
 * One case: the answers to the first invocation, to a retry at once and to two retries once the first one's lease
 * has ended; how often the handler had run after each; how often the lease was renewed after the first answer.
 */
interface Line {
  case: string;
  answers: Result[];
  runsAt: number[];
  renewed: number;
  /** What the case threw, if it did. */
  error?: string;
}

let lines: Line[] = [];
let child: SourceProcess | undefined;
beforeAll(async () => {
  child = spawnSource(join(__dirname, 'fixtures', 'http-middy-early.ts'), {});
  const collected: Line[] = [];
  child.lines.on('line', (line) => collected.push(JSON.parse(line) as Line));
  await new Promise<void>((resolve) => child?.child.once('exit', () => resolve()));
  lines = collected;
});
afterAll(() => child?.kill());

function caseOf(name: string): Line {
  const line = lines.find((l) => l.case === name);
  if (line === undefined) throw new Error(`no line for ${name}`);
  return line;
}

const statuses = (line: Line) => line.answers.map((answer) => answer.statusCode);
const replayed = (line: Line) =>
  line.answers.map((answer) => answer.headers?.['idempotent-replayed'] === 'true');
const inProgress = (answer: Result | undefined) =>
  expect(JSON.parse(answer?.body as string)).toMatchObject({
    type: 'https://oncely.dev/problems/request-in-progress',
  });

describe('a middleware used after idempotencyMiddleware answers early: oncely neither stores nor releases', () => {
  test('from before: the key is held (409) until its lease ends, then a retry runs the handler', () => {
    const line = caseOf('before, used after oncely');
    expect(statuses(line)).toEqual([503, 409, 201, 201]);
    inProgress(line.answers[1]);
    expect(replayed(line)).toEqual([false, false, false, true]);
    expect(line.runsAt).toEqual([0, 0, 1, 1]);
  });

  test('from after: the handler ran, nothing was stored, and once the lease ends a retry runs it again', () => {
    const line = caseOf('after, used after oncely');
    expect(statuses(line)).toEqual([503, 409, 201, 201]);
    expect(line.runsAt).toEqual([1, 1, 2, 2]);
    expect(line.answers[2]?.body).toBe('run 2');
  });

  test('from onError: the handler threw, the key is held (409) until its lease ends', () => {
    const line = caseOf('onError, used after oncely');
    expect(statuses(line)).toEqual([503, 409, 201, 201]);
    expect(line.runsAt).toEqual([1, 1, 2, 2]);
  });

  test('with an explicit lockTimeout the lease is renewed while the process runs: the key stays held', () => {
    const line = caseOf('before, used after oncely, with lockTimeout');
    expect(statuses(line)).toEqual([503, 409, 409, 409]);
    expect(line.runsAt).toEqual([0, 0, 0, 0]);
    // Every third of lockTimeout (1 s) over 2.5 s: about 7.
    expect(line.renewed).toBeGreaterThanOrEqual(3);
  });
});

describe('idempotencyMiddleware used after the middleware that answers early', () => {
  test('from before: oncely never saw the event, a retry runs at once', () => {
    const line = caseOf('before, used before oncely');
    expect(statuses(line)).toEqual([503, 201, 201, 201]);
    expect(replayed(line)).toEqual([false, false, true, true]);
    expect(line.runsAt).toEqual([0, 1, 1, 1]);
  });

  test("from after: oncely's after ran first and stored the handler's own result, which retries get", () => {
    const line = caseOf('after, used before oncely');
    expect(statuses(line)).toEqual([503, 201, 201, 201]);
    expect(replayed(line)).toEqual([false, true, true, true]);
    expect(line.runsAt).toEqual([1, 1, 1, 1]);
    expect(line.answers[1]?.body).toBe('run 1');
  });

  test("from onError: oncely's onError ran first and released the key, a retry runs at once", () => {
    const line = caseOf('onError, used before oncely');
    expect(statuses(line)).toEqual([503, 201, 201, 201]);
    expect(line.runsAt).toEqual([1, 2, 2, 2]);
  });

  test('a replay is an early response too: no after of another middleware runs on it', () => {
    const line = caseOf('a header added in after, used before oncely');
    expect(statuses(line)).toEqual([201, 201, 201, 201]);
    expect(replayed(line)).toEqual([false, true, true, true]);
    expect(line.answers.map((answer) => answer.headers?.['x-added'] ?? null)).toEqual([
      'yes',
      null,
      null,
      null,
    ]);
  });

  test('after a JSON body parser: the fingerprint reads the parsed body, key order aside', () => {
    const line = caseOf('a JSON body parser used before oncely');
    expect(line.error).toBeUndefined();
    expect(statuses(line)).toEqual([201, 201, 422]);
    expect(replayed(line)).toEqual([false, true, false]);
    expect(line.runsAt).toEqual([1]);
  });
});
