import { Idempotency, IdempotencyOptionsError, type IdempotencyStore, MemoryStore } from '@oncely/core';
import type { HttpDecision, HttpRequestInput } from '@oncely/core/adapter';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function input(key: string | undefined, body: unknown = { a: 1 }): HttpRequestInput<unknown> {
  return {
    method: 'POST',
    url: '/charges',
    headers: key === undefined ? {} : { 'idempotency-key': key },
    body,
    request: {},
  };
}

const ok = { status: 201, headers: { 'content-type': 'application/json' }, body: Buffer.from('{"id":1}') };

function expectExecute(decision: HttpDecision) {
  if (decision.action !== 'execute') throw new Error(`expected execute, got ${decision.action}`);
  return decision.execution;
}

describe('options are checked once, at construction', () => {
  test.each([
    [{ ttl: 'soon' }, 'ttl'],
    [{ ttl: 0 }, 'ttl'],
    [{ lockTimeout: -5 }, 'lockTimeout'],
    [{ header: 'bad header' }, 'header'],
    [{ maxKeyLength: 0 }, 'maxKeyLength'],
    [{ required: 'yes' }, 'required'],
    [{ methods: 'POST' }, 'methods'],
    [{ scope: 'tenant' }, 'scope'],
    [{ fingerprint: true }, 'fingerprint'],
    [{ inProgress: 'wait' }, 'inProgress'],
    [{ inProgress: { wait: 'forever' } }, 'inProgress.wait'],
    [{ inProgressStatus: 423 }, 'inProgressStatus'],
    [{ cacheable: true }, 'cacheable'],
    [{ maxBodyBytes: 1.5 }, 'maxBodyBytes'],
    [{ excludeHeaders: 'x-a' }, 'excludeHeaders'],
    [{ onStoreError: 'ignore' }, 'onStoreError'],
    [{ logger: { info() {} } }, 'logger'],
    [{ hooks: { onHit: 1 } }, 'hooks.onHit'],
    [{ store: {} }, 'store'],
    [{ ttlMs: 5 }, 'ttlMs'],
  ])('%p is refused, naming %s and the fix', (options, name) => {
    let error: unknown;
    try {
      new Idempotency(options as never);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(IdempotencyOptionsError);
    expect((error as IdempotencyOptionsError).option).toBe(name);
    expect((error as Error).message).toMatch(new RegExp(`^oncely: option "${name.replace('.', '\\.')}" `));
    expect((error as Error).message.length).toBeGreaterThan(`oncely: option "${name}" `.length + 15);
  });

  test('the caller’s options object is never modified', () => {
    const options = Object.freeze({ ttl: '1h', methods: Object.freeze(['post']), hooks: Object.freeze({}) });
    const engine = new Idempotency(options);
    expect(engine.options.ttlMs).toBe(3_600_000);
    expect(engine.covers('POST')).toBe(true);
    expect(options).toEqual({ ttl: '1h', methods: ['post'], hooks: {} });
  });

  test('defaults are the documented ones', () => {
    const o = new Idempotency().options;
    expect(o.ttlMs).toBe(86_400_000);
    expect(o.lockTimeoutMs).toBe(30_000);
    expect(o.header).toBe('idempotency-key');
    expect(o.maxKeyLength).toBe(255);
    expect(o.required).toBe(false);
    expect([...o.methods]).toEqual(['POST', 'PUT', 'PATCH']);
    expect(o.inProgressStatus).toBe(409);
    expect(o.waitMs).toBeUndefined();
    expect(o.cacheable(499)).toBe(true);
    expect(o.cacheable(500)).toBe(false);
    expect(o.maxBodyBytes).toBe(1_048_576);
    expect(o.failOpen).toBe(false);
    expect(o.store).toBeInstanceOf(MemoryStore);
  });

  test('with() overrides some options and keeps the rest, store included', () => {
    const base = new Idempotency({ ttl: '1h', required: true });
    const route = base.with({ ttl: '2h' });
    expect(route.options.ttlMs).toBe(7_200_000);
    expect(route.options.required).toBe(true);
    expect(route.options.store).toBe(base.options.store);
  });
});

describe('lease renewal and fencing', () => {
  test('the lease is renewed while the handler runs, so a long handler is not taken over', async () => {
    // Fake timers move the store's clock and the renewal timer together: a loaded machine cannot stall the
    // renewal past a lease. The store's answers still wait for real loop turns (setImmediate).
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore();
      const engine = new Idempotency({ store, lockTimeout: 90 });
      const execution = expectExecute(await engine.handle(input('long')));
      await jest.advanceTimersByTimeAsync(400); // more than four leases
      const second = await engine.handle(input('long'));
      expect(second.action).toBe('respond');
      if (second.action === 'respond') expect(second.response.status).toBe(409);
      await execution.complete(ok);
      const replay = await engine.handle(input('long'));
      expect(replay.action === 'respond' && replay.replayed).toBe(true);
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('renewal stops when the execution settles', async () => {
    const store = new MemoryStore();
    let renewals = 0;
    const counting: IdempotencyStore = {
      acquire: (k, o) => store.acquire(k, o),
      complete: (k, t, r, ttl) => store.complete(k, t, r, ttl),
      release: (k, t) => store.release(k, t),
      renew: (k, t, ms) => {
        renewals++;
        return store.renew(k, t, ms);
      },
    };
    // Fake timers: the renewals due in 150 ms all run, however late a loaded machine would have fired them.
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const engine = new Idempotency({ store: counting, lockTimeout: 60 });
      const execution = expectExecute(await engine.handle(input('renewals')));
      await jest.advanceTimersByTimeAsync(150);
      await execution.complete(ok);
      const after = renewals;
      expect(after).toBeGreaterThanOrEqual(2);
      await jest.advanceTimersByTimeAsync(150);
      expect(renewals).toBe(after);
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('an owner whose lease was taken over is fenced: its completion is refused and reported', async () => {
    // Fake timers: the lease runs out when told, whatever the load, and nothing else moves meanwhile.
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore();
      const fenced: string[] = [];
      // A store that never renews, as if the owner were stalled past its lease.
      const stalled: IdempotencyStore = {
        acquire: (k, o) => store.acquire(k, o),
        complete: (k, t, r, ttl) => store.complete(k, t, r, ttl),
        release: (k, t) => store.release(k, t),
        renew: async () => true,
      };
      const warnings: string[] = [];
      const logger = {
        debug() {},
        info() {},
        error() {},
        warn: (_o: object, msg?: string) => void warnings.push(msg ?? ''),
      };
      const engine = new Idempotency({
        store: stalled,
        lockTimeout: 50,
        logger,
        hooks: { onFenced: (e) => fenced.push(e.operation) },
      });
      const first = expectExecute(await engine.handle(input('fenced')));
      await jest.advanceTimersByTimeAsync(150);
      const second = expectExecute(await engine.handle(input('fenced')));
      await first.complete({ ...ok, body: Buffer.from('stale') });
      expect(fenced).toEqual(['complete']);
      expect(warnings.some((w) => /lost its lease/.test(w))).toBe(true);
      await second.complete({ ...ok, body: Buffer.from('fresh') });
      const replay = await engine.handle(input('fenced'));
      if (replay.action !== 'respond') throw new Error('expected a replay');
      expect(Buffer.from(replay.response.body).toString()).toBe('fresh');
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('a failed renewal does not end the execution; a later one may succeed', async () => {
    // Fake timers: a loaded machine cannot delay the second renewal past the 150 ms lease.
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore();
      let calls = 0;
      const flaky: IdempotencyStore = {
        acquire: (k, o) => store.acquire(k, o),
        complete: (k, t, r, ttl) => store.complete(k, t, r, ttl),
        release: (k, t) => store.release(k, t),
        renew: (k, t, ms) => (++calls === 1 ? Promise.reject(new Error('timeout')) : store.renew(k, t, ms)),
      };
      const errors: string[] = [];
      const engine = new Idempotency({
        store: flaky,
        lockTimeout: 150,
        hooks: { onStoreError: (e) => errors.push(e.operation) },
      });
      const execution = expectExecute(await engine.handle(input('flaky')));
      await jest.advanceTimersByTimeAsync(400);
      expect(errors).toEqual(['renew']);
      expect(calls).toBeGreaterThanOrEqual(2);
      expect((await engine.handle(input('flaky'))).action).toBe('respond');
      await execution.complete(ok);
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });

  test('a slow renewal does not delay the next one: renewals are sent a third of the lease apart', async () => {
    // Fake timers: the store's slowness is exact, and the clock moves only when told.
    jest.useFakeTimers({ doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'] });
    try {
      const store = new MemoryStore();
      const sent: number[] = [];
      const start = Date.now();
      const slow: IdempotencyStore = {
        acquire: (k, o) => store.acquire(k, o),
        complete: (k, t, r, ttl) => store.complete(k, t, r, ttl),
        release: (k, t) => store.release(k, t),
        // Each renewal takes 80 of the 100 ms between renewals.
        renew: async (k, t, ms) => {
          sent.push(Date.now() - start);
          await new Promise((resolve) => setTimeout(resolve, 80));
          return store.renew(k, t, ms);
        },
      };
      const engine = new Idempotency({ store: slow, lockTimeout: 300 });
      const execution = expectExecute(await engine.handle(input('slow-renew')));
      await jest.advanceTimersByTimeAsync(450);
      // Counted from each answer instead, they would go at 100, 280 and 460 ms.
      expect(sent).toEqual([100, 200, 300, 400]);
      await execution.complete(ok);
      await store.close();
    } finally {
      jest.useRealTimers();
    }
  });
});

describe('wait mode without a store wake-up', () => {
  test('polls with backoff and replays once the first request completes', async () => {
    const store = new MemoryStore();
    let acquires = 0;
    const noWake: IdempotencyStore = {
      acquire: (k, o) => {
        acquires++;
        return store.acquire(k, o);
      },
      complete: (k, t, r, ttl) => store.complete(k, t, r, ttl),
      release: (k, t) => store.release(k, t),
      renew: (k, t, ms) => store.renew(k, t, ms),
    };
    const engine = new Idempotency({ store: noWake, inProgress: { wait: '5s' } });
    const first = expectExecute(await engine.handle(input('poll')));
    const waiting = engine.handle(input('poll'));
    await sleep(500);
    await first.complete(ok);
    const decision = await waiting;
    expect(decision.action === 'respond' && decision.replayed).toBe(true);
    // Backoff, not a busy loop: 500ms of waiting costs a handful of acquires, not hundreds.
    expect(acquires).toBeLessThan(15);
    await store.close();
  });
});

describe('a store whose wake-up fails', () => {
  test('a waitFor that rejects or throws: the wait polls instead, and the duplicate gets the replay', async () => {
    for (const failure of ['rejects', 'throws'] as const) {
      class FailingWake extends MemoryStore {
        override waitFor(): Promise<void> {
          if (failure === 'throws') throw new Error('subscriber down');
          return Promise.reject(new Error('subscriber down'));
        }
      }
      const store = new FailingWake();
      const engine = new Idempotency({ store, inProgress: { wait: '5s' } });
      const first = expectExecute(await engine.handle(input(`wake-${failure}`)));
      const waiting = engine.handle(input(`wake-${failure}`));
      await sleep(100);
      await first.complete(ok);
      const decision = await waiting;
      expect([failure, decision.action === 'respond' && decision.replayed]).toEqual([failure, true]);
      await store.close();
    }
  });
});

describe('store answers', () => {
  test('an unknown acquire result is a store error (503), not a hang', async () => {
    const odd: IdempotencyStore = {
      acquire: async () => ({ status: 'maybe' }) as never,
      complete: async () => true,
      release: async () => true,
      renew: async () => true,
    };
    const decision = await new Idempotency({ store: odd }).handle(input('odd'));
    expect(decision.action === 'respond' && decision.response.status).toBe(503);
  });

  test('wait mode reports one conflict per request, however long it waits', async () => {
    const conflicts: string[] = [];
    const engine = new Idempotency({
      inProgress: { wait: 300 },
      hooks: { onConflict: (e) => conflicts.push(e.key) },
    });
    const first = expectExecute(await engine.handle(input('w')));
    const waited = await engine.handle(input('w'));
    expect(waited.action === 'respond' && waited.response.status).toBe(409);
    expect(conflicts).toEqual(['w']);
    await first.complete(ok);
  });
});

describe('execution outcomes', () => {
  test('complete and fail are idempotent: only the first counts', async () => {
    const engine = new Idempotency();
    const execution = expectExecute(await engine.handle(input('once')));
    await execution.complete(ok);
    await execution.fail(new Error('late'));
    await execution.complete({ ...ok, status: 500 });
    const replay = await engine.handle(input('once'));
    expect(replay.action === 'respond' && replay.response.status).toBe(201);
  });

  test('a handler cannot forge the engine’s too-large marker header', async () => {
    const engine = new Idempotency();
    const execution = expectExecute(await engine.handle(input('forged')));
    await execution.complete({ ...ok, headers: { ...ok.headers, 'X-Oncely-Body-Omitted': '1' } });
    const replay = await engine.handle(input('forged'));
    if (replay.action !== 'respond') throw new Error('expected a replay');
    expect(replay.response.status).toBe(201);
    expect(Buffer.from(replay.response.body).toString()).toBe('{"id":1}');
  });

  test('a store failure while completing is reported, not thrown', async () => {
    const store = new MemoryStore();
    const errors: string[] = [];
    const breaking: IdempotencyStore = {
      acquire: (k, o) => store.acquire(k, o),
      complete: () => Promise.reject(new Error('down')),
      release: () => Promise.reject(new Error('down')),
      renew: (k, t, ms) => store.renew(k, t, ms),
    };
    const engine = new Idempotency({
      store: breaking,
      hooks: { onStoreError: (e) => errors.push(e.operation) },
    });
    await expect(expectExecute(await engine.handle(input('c1'))).complete(ok)).resolves.toBeUndefined();
    await expect(
      expectExecute(await engine.handle(input('c2'))).fail(new Error('x')),
    ).resolves.toBeUndefined();
    expect(errors).toEqual(['complete', 'release']);
    await store.close();
  });

  test('a fail-open execution touches no store', async () => {
    let calls = 0;
    const down: IdempotencyStore = {
      acquire: () => Promise.reject(new Error('down')),
      complete: async () => ++calls > 0,
      release: async () => ++calls > 0,
      renew: async () => ++calls > 0,
    };
    const engine = new Idempotency({ store: down, onStoreError: 'fail-open', lockTimeout: 30 });
    const execution = expectExecute(await engine.handle(input('open')));
    expect(execution.protected).toBe(false);
    await sleep(100);
    await execution.complete(ok);
    expect(calls).toBe(0);
  });
});

describe('logging', () => {
  test('a pino logger plugs in as it is and records a down store', async () => {
    const { default: pino } = await import('pino');
    const lines: { level: number; msg: string; key?: string }[] = [];
    const logger = pino({ level: 'debug' }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const down: IdempotencyStore = {
      acquire: () => Promise.reject(new Error('ECONNREFUSED')),
      complete: async () => true,
      release: async () => true,
      renew: async () => true,
    };
    const decision = await new Idempotency({ store: down, logger }).handle(input('logged'));
    expect(decision.action === 'respond' && decision.response.status).toBe(503);
    const line = lines.find((l) => /store unavailable/.test(l.msg));
    expect(line?.level).toBe(50); // error
    expect(line?.key).toBe('logged');
  });
});

describe('unscoped keys behind credentials', () => {
  function credentialed(key: string, headers: Record<string, string>): HttpRequestInput<unknown> {
    return { ...input(key), headers: { 'idempotency-key': key, ...headers } };
  }
  function watched(options: ConstructorParameters<typeof Idempotency>[0] = {}) {
    const warnings: { obj: Record<string, unknown>; msg: string | undefined }[] = [];
    const events: unknown[] = [];
    const logger = {
      debug() {},
      info() {},
      error() {},
      warn: (obj: object, msg?: string) => void warnings.push({ obj: obj as Record<string, unknown>, msg }),
    };
    const engine = new Idempotency({
      logger,
      hooks: { onUnscopedCredentials: (event) => void events.push(event) },
      ...options,
    });
    return { engine, warnings, events };
  }

  test('warns once per engine, naming the risk, the fix and the docs, then never again', async () => {
    const { engine, warnings, events } = watched();
    for (let i = 0; i < 5; i++) {
      const execution = expectExecute(
        await engine.handle(credentialed(`cred-${i}`, { authorization: 'Bearer secret-token' })),
      );
      await execution.complete(ok);
    }
    expectExecute(await engine.handle(credentialed('cookie-1', { cookie: 'session=abc' })));
    expect(warnings).toHaveLength(1);
    expect(warnings[0]?.obj.header).toBe('authorization');
    expect(warnings[0]?.msg).toMatch(/without a scope/);
    expect(warnings[0]?.msg).toMatch(/scope: false/);
    expect(warnings[0]?.msg).toMatch(/scopeByHeader/);
    expect(warnings[0]?.msg).toMatch(/docs\/security\.md#always-set-scope-on-an-authenticated-api/);
    expect(JSON.stringify(warnings)).not.toContain('secret-token');
    expect(events).toEqual([{ header: 'authorization' }]);
  });

  test('a Cookie header alone warns too', async () => {
    const { engine, warnings, events } = watched();
    expectExecute(await engine.handle(credentialed('c', { cookie: 'session=abc' })));
    expect(warnings.map((w) => w.obj.header)).toEqual(['cookie']);
    expect(events).toEqual([{ header: 'cookie' }]);
  });

  test('a plugin and its routes (with()) warn once between them', async () => {
    const { engine, warnings } = watched();
    const route = engine.with({ ttl: '1h' });
    expectExecute(await route.handle(credentialed('r1', { authorization: 'Basic x' })));
    expectExecute(await engine.handle(credentialed('r2', { authorization: 'Basic x' })));
    expect(warnings).toHaveLength(1);
  });

  test.each([
    ['scope: false', { scope: false as const }],
    ['a scope function', { scope: () => 'user:1' }],
  ])('%s: no warning', async (_name, options) => {
    const { engine, warnings, events } = watched(options);
    expectExecute(await engine.handle(credentialed('s', { authorization: 'Bearer t', cookie: 'a=b' })));
    expect(warnings).toHaveLength(0);
    expect(events).toHaveLength(0);
  });

  test('no warning for requests without credentials, without a key, or with a method not covered', async () => {
    const { engine, warnings } = watched();
    expectExecute(await engine.handle(credentialed('plain', { 'x-api-version': '2' })));
    expect(
      (await engine.handle({ ...input(undefined), headers: { authorization: 'Bearer t' } })).action,
    ).toBe('pass');
    expect(
      (await engine.handle({ ...credentialed('get', { authorization: 'Bearer t' }), method: 'GET' })).action,
    ).toBe('pass');
    expect(warnings).toHaveLength(0);
    // and the check stays armed: the first credentialed covered request still warns
    expectExecute(await engine.handle(credentialed('now', { authorization: 'Bearer t' })));
    expect(warnings).toHaveLength(1);
  });

  test('without a logger, the warning is a process warning with a code', async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    try {
      const engine = new Idempotency();
      expectExecute(await engine.handle(credentialed('p1', { authorization: 'Bearer t' })));
      expectExecute(await engine.handle(credentialed('p2', { authorization: 'Bearer t' })));
      expect(emitWarning).toHaveBeenCalledTimes(1);
      const [message, options] = emitWarning.mock.calls[0] as [string, { code: string }];
      expect(message).toMatch(/without a scope/);
      expect(options.code).toBe('ONCELY_UNSCOPED_CREDENTIALS');
    } finally {
      emitWarning.mockRestore();
    }
  });

  test('scope must be a function or false', () => {
    expect(() => new Idempotency({ scope: true as never })).toThrow(/option "scope" .*or false/);
  });
});

describe('Execution.abandon: the adapter lost track of a handler that may still run', () => {
  test('nothing is stored or released: a retry gets 409 until the lease lapses, then runs', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store, lockTimeout: 120 });
    const execution = expectExecute(await engine.handle(input('abandoned')));
    await sleep(100); // renewed once meanwhile (every lockTimeout / 3)
    execution.abandon();
    // What is sent now is not the handler's answer: it is not stored.
    await execution.complete({ status: 408, headers: {}, body: Buffer.from('timeout') });
    const during = await engine.handle(input('abandoned'));
    expect(during.action).toBe('respond');
    if (during.action === 'respond') expect(during.response.status).toBe(409);
    await sleep(200); // no renewal after abandon(): the lease lapses
    expect((await engine.handle(input('abandoned'))).action).toBe('execute');
  });

  test('headersBeforeHandler: headers still there unchanged are not stored, changed ones are', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const execution = expectExecute(await engine.handle(input('outer')));
    const outer = {
      'x-request-id': 'req-1',
      'access-control-allow-origin': 'https://a.example',
      vary: 'Origin',
    };
    execution.headersBeforeHandler(outer);
    await execution.complete({
      status: 201,
      headers: { ...outer, vary: 'Origin, Accept', 'content-type': 'application/json' },
      body: Buffer.from('{}'),
    });
    const replay = await engine.handle(input('outer'));
    if (replay.action !== 'respond') throw new Error('expected a replay');
    expect(replay.response.headers['x-request-id']).toBeUndefined();
    expect(replay.response.headers['access-control-allow-origin']).toBeUndefined();
    expect(replay.response.headers.vary).toBe('Origin, Accept');
    expect(replay.response.headers['content-type']).toBe('application/json');
  });
});

describe('a scope value with a missing value in it', () => {
  const scoped = (scope: (req: { user?: { id?: unknown } }) => string) =>
    new Idempotency<{ user?: { id?: unknown } }>({ scope });
  const request = (user?: { id?: unknown }) => ({ ...input('k1'), request: { user } });

  test.each([
    ['user:undefined', (req: { user?: { id?: unknown } }) => `user:${req.user?.id}`, undefined],
    ['undefined', (req: { user?: { id?: unknown } }) => String(req.user?.id), undefined],
    ['tenant:[object Object]', (req: { user?: { id?: unknown } }) => `tenant:${req.user?.id}`, { id: {} }],
  ])('%p is refused with a 500 problem, never shared by every such request', async (_value, scope, user) => {
    const engine = scoped(scope);
    const decision = await engine.handle(request(user as { id?: unknown }));
    expect(decision.action).toBe('respond');
    if (decision.action === 'respond') expect(decision.response.status).toBe(500);
  });

  test.each([
    'undefined',
    'user:undefined',
    'undefined:42',
    'tenant/undefined/user/42',
    'org|undefined',
    'a.undefined.b',
    'tenant=undefined;user=42',
    'user undefined',
    'tenant:[object Object]',
    '[object Promise]',
    'user:[object Map]:x',
  ])('%p (a whole undefined segment, or [object X]) is refused', async (value) => {
    const decision = await scoped(() => value).handle(request());
    expect(decision.action === 'respond' && decision.response.status).toBe(500);
  });

  test.each([
    'user:42',
    'tenant:undefinedness',
    'anonymous',
    'user:undefined_id',
    'user:undefined@example.com',
    'tenant:undefined-labs',
    'org-undefined',
    'undefinedx:1',
    'user:null',
    'user:',
    '[object]',
  ])('%p is a scope like any other', async (value) => {
    const engine = scoped(() => value);
    expect((await engine.handle(request())).action).toBe('execute');
  });

  test('without a logger, the refusal is a process warning ONCELY_SCOPE_UNSET, once per engine', async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    try {
      const engine = scoped((req) => `user:${req.user?.id}`);
      for (const key of ['k1', 'k2', 'k3']) {
        const decision = await engine.handle({ ...input(key), request: {} });
        expect(decision.action === 'respond' && decision.response.status).toBe(500);
      }
      const calls = emitWarning.mock.calls as [string, { code: string }][];
      expect(calls).toHaveLength(1);
      expect(calls[0]?.[1].code).toBe('ONCELY_SCOPE_UNSET');
      expect(calls[0]?.[0]).toMatch(/"user:undefined"/);
      // Another engine says it again: once per middleware, not once per process.
      await scoped((req) => `user:${req.user?.id}`).handle({ ...input('k4'), request: {} });
      expect(emitWarning).toHaveBeenCalledTimes(2);
    } finally {
      emitWarning.mockRestore();
    }
  });

  test('with a logger, each refusal is an error line and no process warning', async () => {
    const emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => {});
    const errors: string[] = [];
    const logger = {
      debug() {},
      info() {},
      warn() {},
      error: (_fields: object, message?: string) => errors.push(message ?? ''),
    };
    try {
      const engine = new Idempotency<{ user?: { id?: unknown } }>({
        scope: (req) => `user:${req.user?.id}`,
        logger,
      });
      for (const key of ['k1', 'k2']) await engine.handle({ ...input(key), request: {} });
      expect(errors).toHaveLength(2);
      expect(errors[0]).toMatch(/"user:undefined".*refused/);
      expect(emitWarning).not.toHaveBeenCalled();
    } finally {
      emitWarning.mockRestore();
    }
  });
});

describe('replays', () => {
  const stored = async (engine: Idempotency, key: string, headers: Record<string, string | string[]>) => {
    const execution = expectExecute(await engine.handle(input(key)));
    await execution.complete({ status: 201, headers, body: Buffer.from('{"id":1}') });
  };

  test('a header added to excludeHeaders after a record was stored is kept out of its replays', async () => {
    const store = new MemoryStore();
    await stored(new Idempotency({ store }), 'k1', { 'content-type': 'application/json', 'x-internal': 'a' });
    const decision = await new Idempotency({ store, excludeHeaders: ['X-Internal'] }).handle(input('k1'));
    if (decision.action !== 'respond') throw new Error('expected a replay');
    expect(decision.replayed).toBe(true);
    expect(decision.response.headers['x-internal']).toBeUndefined();
    expect(decision.response.headers['content-type']).toBe('application/json');
    // The engine that stored it still replays it.
    const before = await new Idempotency({ store }).handle(input('k1'));
    expect(before.action === 'respond' && before.response.headers['x-internal']).toBe('a');
    await store.close();
  });

  test('a replay’s header arrays are its own: a receiver appending to one changes no later replay', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    await stored(engine, 'k1', { link: ['<a>', '<b>'] });
    const first = await engine.handle(input('k1'));
    if (first.action !== 'respond') throw new Error('expected a replay');
    // What Node's res.appendHeader does to the array setHeader was given.
    (first.response.headers.link as string[]).push('<c>');
    first.response.body.fill(0);
    const second = await engine.handle(input('k1'));
    if (second.action !== 'respond') throw new Error('expected a replay');
    expect(second.response.headers.link).toEqual(['<a>', '<b>']);
    expect(Buffer.from(second.response.body).toString()).toBe('{"id":1}');
    await store.close();
  });
});
