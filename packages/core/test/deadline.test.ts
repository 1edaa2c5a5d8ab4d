import { withinDeadline } from '@oncely/core/adapter';

describe('withinDeadline', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  test('the outcome of what answers in time, and no timer left behind', async () => {
    await expect(withinDeadline(100, Promise.resolve('ok'), () => new Error('late'))).resolves.toBe('ok');
    await expect(
      withinDeadline(100, Promise.reject(new Error('own')), () => new Error('late')),
    ).rejects.toThrow('own');
    expect(jest.getTimerCount()).toBe(0);
  });

  test('past the deadline: expire is told the error, the call rejects with it, and a later answer is ignored', async () => {
    let answer!: (value: string) => void;
    const pending = new Promise<string>((resolve) => {
      answer = resolve;
    });
    const expired: Error[] = [];
    const bounded = withinDeadline(
      100,
      pending,
      () => new Error('no answer in 100 ms'),
      (e) => expired.push(e),
    );
    const outcome = bounded.then(
      () => 'resolved',
      (error: Error) => error,
    );
    await jest.advanceTimersByTimeAsync(99);
    expect(expired).toEqual([]);
    await jest.advanceTimersByTimeAsync(1);
    answer('too late');
    const error = await outcome;
    expect(error).toBeInstanceOf(Error);
    expect(expired).toEqual([error]);
    expect((error as Error).message).toBe('no answer in 100 ms');
  });

  test('an expire that throws still settles the call, with the timeout error', async () => {
    const bounded = withinDeadline(
      10,
      new Promise<never>(() => {}),
      () => new Error('no answer'),
      () => {
        throw new Error('expire broke');
      },
    );
    const outcome = bounded.catch((error: Error) => error.message);
    await jest.advanceTimersByTimeAsync(10);
    await expect(outcome).resolves.toBe('no answer');
  });
});
