import {
  IdempotencySetupError,
  InvalidValueError,
  OncelyError,
  parseDuration,
  StoreOperationError,
  ValueOutOfRangeError,
} from '../src';
import { canonicalJson } from '../src/adapter';
import { toChunk } from '../src/node/capture';
import { unknownStatusError } from '../src/shared/protocol';
import type { AcquireResult } from '../src/stores/store';

/** What `run` threw; fails the test when it threw nothing. */
function thrownBy(run: () => unknown): unknown {
  try {
    run();
  } catch (error) {
    return error;
  }
  throw new Error('expected a throw');
}

describe("core's error sites throw OncelyErrors and keep their old ancestry", () => {
  const cyclic: { self?: unknown } = {};
  cyclic.self = cyclic;
  let endless: { toJSON(): unknown };
  endless = { toJSON: () => endless };
  const nested = (depth: number): unknown => (depth === 0 ? cyclic : { inner: nested(depth - 1) });

  test.each<[string, () => unknown, new (...args: never[]) => Error, string]>([
    ['parseDuration', () => parseDuration('soon' as never), TypeError, 'Invalid duration "soon"'],
    ['canonicalJson of a cycle', () => canonicalJson(nested(200)), TypeError, 'contains itself'],
    ['canonicalJson of an endless toJSON', () => canonicalJson(endless), RangeError, 'chain without end'],
    ['a response stream chunk that is not bytes', () => toChunk(5), TypeError, 'gave a number chunk'],
    [
      'a store acquire with an unknown status',
      () => {
        throw unknownStatusError({ status: 'weird' } as unknown as AcquireResult);
      },
      Error,
      'unknown status "weird"',
    ],
  ])('%s', (_site, run, ancestor, message) => {
    const error = thrownBy(run);
    expect(error).toBeInstanceOf(OncelyError);
    expect(error).toBeInstanceOf(ancestor);
    expect((error as Error).message).toContain(message);
  });

  test('the new classes are OncelyErrors with their old bases, and tell themselves apart', () => {
    expect(new InvalidValueError('x')).toBeInstanceOf(TypeError);
    expect(new ValueOutOfRangeError('x')).toBeInstanceOf(RangeError);
    for (const error of [
      new InvalidValueError('x'),
      new ValueOutOfRangeError('x'),
      new StoreOperationError('x'),
      new IdempotencySetupError('x'),
    ]) {
      expect(error).toBeInstanceOf(OncelyError);
      expect(error.name).toBe(error.constructor.name);
    }
    expect(new StoreOperationError('x')).not.toBeInstanceOf(IdempotencySetupError);
  });
});
