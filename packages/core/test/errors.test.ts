import {
  Idempotency,
  IdempotencyInProgressError,
  IdempotencyKeyError,
  IdempotencyMismatchError,
  IdempotencyOptionsError,
  IdempotencyReplayError,
  IdempotencyStoreError,
  OncelyError,
  PermanentError,
  UnstorableResultError,
} from '../src';

describe('OncelyError: the base of every error oncely throws', () => {
  const errors = [
    new IdempotencyInProgressError('k', 100),
    new IdempotencyMismatchError('k'),
    new IdempotencyKeyError('bad key'),
    new IdempotencyStoreError('k', 'acquire', { cause: new Error('down') }),
    new UnstorableResultError('k', 'the result is undefined', false),
    new PermanentError('declined'),
    new IdempotencyReplayError('k', 'not JSON'),
    new IdempotencyOptionsError('ttl', 'must be a duration'),
  ];

  test.each(errors.map((error) => [error.name, error]))(
    '%s is an OncelyError and an Error',
    (_name, error) => {
      expect(error).toBeInstanceOf(OncelyError);
      expect(error).toBeInstanceOf(Error);
    },
  );

  test('an option error stays a TypeError and names its option', () => {
    let thrown: unknown;
    try {
      new Idempotency({ ttl: 'soon' as never });
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(IdempotencyOptionsError);
    expect(thrown).toBeInstanceOf(TypeError);
    expect(thrown).toBeInstanceOf(OncelyError);
    expect((thrown as IdempotencyOptionsError).option).toBe('ttl');
  });

  test("the app's errors are not oncely's, and each subclass keeps its own check", () => {
    expect(new Error('x')).not.toBeInstanceOf(OncelyError);
    expect(new TypeError('x')).not.toBeInstanceOf(OncelyError);
    expect(null).not.toBeInstanceOf(OncelyError);
    expect('oncely').not.toBeInstanceOf(OncelyError);
    expect(new IdempotencyKeyError('x')).not.toBeInstanceOf(IdempotencyStoreError);
    expect(new IdempotencyMismatchError('k')).not.toBeInstanceOf(IdempotencyOptionsError);
    expect(new OncelyError('x')).toBeInstanceOf(OncelyError);
  });

  test('an error marked by another copy of oncely (the same registered symbol) is one too', () => {
    class Elsewhere extends Error {}
    Object.defineProperty(Elsewhere.prototype, Symbol.for('oncely.error'), { value: true });
    expect(new Elsewhere('x')).toBeInstanceOf(OncelyError);
  });
});
