// Middy with a second registration on one handler, run in a process of its own (Middy is ESM-only, which jest
// cannot load): fixtures/http-nested-middy.ts runs the cases of http-nested-cases.ts and prints what they gave.
import { join } from 'node:path';
import { type SourceProcess, spawnSource } from '@oncely/testing';
import {
  type Agreeing,
  DIFFERING,
  expectAgreeing,
  expectRefused,
  type Refused,
  type Result,
} from './http-nested-cases';

jest.setTimeout(60_000);

type Line = { combo: string; case: string } & Partial<Agreeing & Refused> & {
    answers?: Result[];
    runs: number;
  };

const COMBOS = [
  'withIdempotency inside Middy',
  'Middy inside withIdempotency',
  'one middleware used twice',
  'two middlewares',
  'the router inside Middy',
  'Middy inside the router (app.use)',
  'Middy inside the router (the route)',
];
// Middy runs the handler outside its middlewares: currentIdempotency() reaches it only where the registration
// that handles the event runs it (withIdempotency, the router's middleware), or runs Middy.
const CURRENT_REACHES = new Set([
  'withIdempotency inside Middy',
  'Middy inside withIdempotency',
  'the router inside Middy',
  'Middy inside the router (app.use)',
  'Middy inside the router (the route)',
]);

let lines: Line[] = [];
let child: SourceProcess | undefined;
beforeAll(async () => {
  child = spawnSource(join(__dirname, 'fixtures', 'http-nested-middy.ts'), {});
  const collected: Line[] = [];
  child.lines.on('line', (line) => collected.push(JSON.parse(line) as Line));
  await new Promise<void>((resolve) => child?.child.once('exit', () => resolve()));
  lines = collected;
});
afterAll(() => child?.kill());

function lineOf<T>(combo: string, which: string): T {
  const line = lines.find((l) => l.combo === combo && l.case === which);
  if (line === undefined) throw new Error(`no ${which} line for ${combo}`);
  return line as T;
}

describe.each(COMBOS)('Middy: %s', (combo) => {
  test('the same options: the handler runs once under the outer registration, its answer replayed', () => {
    expectAgreeing(lineOf<Agreeing>(combo, 'agreeing'), CURRENT_REACHES.has(combo));
  });
});

// One middleware object used twice has one set of options: it cannot conflict with itself.
describe.each(COMBOS.filter((combo) => combo !== 'one middleware used twice'))('Middy: %s', (combo) => {
  test.each(DIFFERING)(
    '%s set otherwise nearer the handler: 500 conflicting-registrations, the key released',
    (option) => {
      expectRefused(lineOf<Refused>(combo, option), option);
    },
  );
});

test('Middy: oncely meeting its own mark from an invocation whose after Middy skipped is not nested', () => {
  const line = lineOf<{ answers: Result[]; runs: number }>('early response inside', 'stale');
  expect(line.answers.map((answer) => answer.statusCode)).toEqual([503, 409]);
  expect(line.runs).toBe(0);
});
