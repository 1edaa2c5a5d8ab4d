import { type Duration, parseDuration } from '@oncely/core';
import { canonicalJson, defaultFingerprint, parseKey } from '@oncely/core/adapter';

describe('parseDuration', () => {
  test.each([
    [0, 0],
    [1500, 1500],
    ['250ms', 250],
    ['30s', 30_000],
    ['1.5s', 1500],
    ['5m', 300_000],
    ['24h', 86_400_000],
    ['7d', 604_800_000],
    [' 10s ', 10_000],
  ])('%p is %p ms', (input, ms) => {
    expect(parseDuration(input)).toBe(ms);
  });

  // Typed as Duration, so that the type check proves these compile: every one must parse too.
  const accepted: [Duration, number][] = [
    ['1e3ms', 1000],
    ['1e3 ms', 1000],
    ['.5h', 1_800_000],
    ['5.s', 5000],
    ['+5s', 5000],
    ['0x10s', 16_000],
    ['-0s', 0],
  ];
  test.each(accepted)('%p, a Duration by its type, is %p ms', (input, ms) => {
    expect(parseDuration(input)).toBe(ms);
  });

  test.each([
    -1,
    Number.NaN,
    Number.POSITIVE_INFINITY,
    '',
    '10',
    '10 years',
    's',
    'ms',
    '5s5s',
    '1 0s',
    'Infinityms',
  ])('%p is refused', (input) => {
    expect(() => parseDuration(input)).toThrow(/Invalid duration/);
  });

  // The Duration type cannot refuse a negative: parseDuration does, where options are checked.
  const negative: Duration[] = ['-5s', '-1e3ms', -5];
  test.each(negative)('%p is refused', (input) => {
    expect(() => parseDuration(input)).toThrow(/Invalid duration/);
  });
});

describe('parseKey', () => {
  test.each([
    ['abc', 'abc'],
    ['  abc\t', 'abc'],
    ['"abc"', 'abc'],
    ['"a\\"b"', 'a"b'],
    ['"a\\\\b"', 'a\\b'],
    ['8e03978e-40d5-43e8-bc93-6894a57f9324', '8e03978e-40d5-43e8-bc93-6894a57f9324'],
    ['!#$%&*+-.^_`|~', '!#$%&*+-.^_`|~'],
  ])('%p reads as %p', (raw, key) => {
    expect(parseKey(raw, 255)).toBe(key);
  });

  test.each([
    ['', 'empty'],
    ['""', 'empty'],
    ['a b', 'not-visible-ascii'],
    ['"a b"', 'not-visible-ascii'],
    ['caf\u00e9', 'not-visible-ascii'],
    ['a\u0000', 'not-visible-ascii'],
    ['"abc', 'malformed-string'],
    ['"a\\b"', 'malformed-string'],
    ['"abc"x', 'malformed-string'],
    ['"\u00e9"', 'malformed-string'],
    ['k'.repeat(256), 'too-long'],
    ['x'.repeat(100_000), 'too-long'],
    // Only SP and HTAB are trimmed: other whitespace, which String#trim() also drops, is refused.
    ['abc\u00a0', 'not-visible-ascii'],
    ['\u00a0abc', 'not-visible-ascii'],
    ['abc\u000b', 'not-visible-ascii'],
    ['\u000cabc', 'not-visible-ascii'],
    ['abc\n', 'not-visible-ascii'],
    ['\u2028abc', 'not-visible-ascii'],
    ['\ufeff"abc"', 'not-visible-ascii'],
  ])('%p is refused as %p', (raw, problem) => {
    expect(parseKey(raw, 255)).toEqual({ problem });
  });

  test('several values (an array) are refused', () => {
    expect(parseKey(['a', 'b'], 255)).toEqual({ problem: 'multiple-values' });
  });

  test('maxLength applies to the unquoted key', () => {
    expect(parseKey(`"${'k'.repeat(10)}"`, 10)).toBe('k'.repeat(10));
    expect(parseKey('k'.repeat(11), 10)).toEqual({ problem: 'too-long' });
  });
});

describe('fingerprint', () => {
  test('canonical JSON sorts keys at every depth and drops undefined like JSON.stringify', () => {
    expect(canonicalJson({ b: 1, a: { d: [3, { f: 1, e: 2 }], c: null }, u: undefined })).toBe(
      '{"a":{"c":null,"d":[3,{"e":2,"f":1}]},"b":1}',
    );
    expect(canonicalJson(new Date(0))).toBe('"1970-01-01T00:00:00.000Z"');
    expect(canonicalJson([undefined])).toBe('[null]');
  });

  test('an already sorted body (native stringify) and any shuffle of it (built) give the same text', () => {
    // Deterministic pseudo-random values: nested objects and arrays, integer-like keys, undefined, unicode.
    let seed = 42;
    const random = () => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed / 2 ** 31;
    };
    const keys = ['a', 'b', 'B', '10', '2', 'é', 'z z', '_', 'aa', 'a\u{1F600}'];
    const make = (depth: number): unknown => {
      const pick = random();
      if (depth > 3 || pick < 0.3) {
        const leaves = [1, -0.5, 'x', '"q"', true, null, undefined, 1e21];
        return leaves[Math.floor(random() * leaves.length)];
      }
      if (pick < 0.5) return Array.from({ length: Math.floor(random() * 4) }, () => make(depth + 1));
      const object: Record<string, unknown> = {};
      for (const key of keys) if (random() < 0.4) object[key] = make(depth + 1);
      return object;
    };
    const rebuild = (value: unknown, order: (names: string[]) => string[]): unknown => {
      if (Array.isArray(value)) return value.map((item) => rebuild(item, order));
      if (value === null || typeof value !== 'object') return value;
      const out: Record<string, unknown> = {};
      for (const key of order(Object.keys(value)))
        out[key] = rebuild((value as Record<string, unknown>)[key], order);
      return out;
    };
    const shuffle = (names: string[]) => [...names].sort(() => random() - 0.5);
    for (let i = 0; i < 500; i++) {
      const value = make(0);
      const shuffled = canonicalJson(rebuild(value, shuffle));
      expect(canonicalJson(rebuild(value, (names) => [...names].sort()))).toBe(shuffled);
      expect(canonicalJson(value)).toBe(shuffled);
    }
    // Not plain data: built, never handed to JSON.stringify as is.
    expect(canonicalJson({ a: new Number(1) })).toBe('{"a":{}}');
    expect(canonicalJson({ a: new Map([['k', 1]]) })).toBe('{"a":{}}');
    expect(canonicalJson(Object.assign(Object.create({ inherited: 1 }), { b: 1, a: 2 }))).toBe(
      '{"a":2,"b":1}',
    );
  });

  test('the same text as the recursive builder it replaced (kept here as the oracle): stored fingerprints stay valid', () => {
    // The builder of earlier versions, as it was: fingerprints already stored were made by it.
    const recursive = (value: unknown): string => {
      if (value === null || typeof value !== 'object') {
        const json = JSON.stringify(value);
        return json === undefined ? 'null' : json;
      }
      const withToJson = value as { toJSON?: () => unknown };
      if (typeof withToJson.toJSON === 'function') return recursive(withToJson.toJSON());
      if (Array.isArray(value)) {
        let out = '[';
        for (let i = 0; i < value.length; i++) out += (i === 0 ? '' : ',') + recursive(value[i]);
        return `${out}]`;
      }
      const record = value as Record<string, unknown>;
      let out = '{';
      for (const key of Object.keys(record).sort()) {
        const item = record[key];
        if (item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
        out += `${out.length === 1 ? '' : ','}${JSON.stringify(key)}:${recursive(item)}`;
      }
      return `${out}}`;
    };
    let seed = 7;
    const random = () => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed / 2 ** 31;
    };
    // Unsorted keys, so that the built path (not the native stringify) answers; every kind of member.
    const keys = ['z', 'b', '10', '2', 'a', 'é', '', 'a"b', '{', '}'];
    const leaves = (): unknown[] => [
      0,
      -1.5,
      '',
      '{',
      'x}',
      true,
      false,
      null,
      undefined,
      () => 1,
      Symbol('s'),
      new Date(0),
      { toJSON: () => undefined },
      { toJSON: () => ({ y: 1, x: [2, { toJSON: () => 'inner' }] }) },
      new Number(3),
      new Map([['k', 1]]),
      [],
      {},
    ];
    const make = (depth: number): unknown => {
      const pick = random();
      if (depth > 5 || pick < 0.3) {
        const all = leaves();
        return all[Math.floor(random() * all.length)];
      }
      if (pick < 0.55) {
        const array: unknown[] = Array.from({ length: Math.floor(random() * 5) }, () => make(depth + 1));
        if (random() < 0.1) array.length += 2; // holes
        return array;
      }
      const object: Record<string, unknown> = {};
      for (const key of keys) if (random() < 0.45) object[key] = make(depth + 1);
      return object;
    };
    for (let i = 0; i < 2000; i++) {
      const value = make(0);
      expect(canonicalJson(value)).toBe(recursive(value));
    }
  });

  test('a body nested deeper than the call stack goes is fingerprinted; a cycle is refused', () => {
    // 200,001 levels: what 400 KB of a JSON body parses to, far past the depth a recursive builder survives.
    const depth = 200_001;
    const arrays = JSON.parse(`${'['.repeat(depth)}${']'.repeat(depth)}`) as unknown;
    expect(canonicalJson(arrays)).toBe(`${'['.repeat(depth)}${']'.repeat(depth)}`);
    const objects = JSON.parse(`${'{"b":1,"a":'.repeat(depth)}0${'}'.repeat(depth)}`) as unknown;
    expect(canonicalJson(objects)).toBe(`${'{"a":'.repeat(depth)}0${',"b":1}'.repeat(depth)}`);
    expect(defaultFingerprint('POST', '/a', arrays)).toMatch(/^[\w-]{43}$/);
    expect(defaultFingerprint('POST', '/a', objects)).not.toBe(defaultFingerprint('POST', '/a', arrays));
    const cycle: Record<string, unknown> = { b: 1 };
    cycle.a = cycle;
    expect(() => canonicalJson(cycle)).toThrow(/contains itself/);
    // A long cycle, and a deep one: found once the check begins, however deep it starts.
    const ring: Record<string, unknown>[] = Array.from({ length: 1_500 }, () => ({ b: 1 }));
    ring.forEach((item, i) => {
      item.a = ring[(i + 1) % ring.length];
    });
    expect(() => canonicalJson(ring[0])).toThrow(/contains itself/);
    // The same object twice, side by side (not a cycle), deep down: written twice.
    const shared = { x: 1 };
    let deep: unknown = { b: shared, a: shared };
    for (let i = 0; i < 2_000; i++) deep = [deep];
    expect(canonicalJson(deep)).toBe(`${'['.repeat(2_000)}{"a":{"x":1},"b":{"x":1}}${']'.repeat(2_000)}`);
    const endless: { toJSON(): unknown } = { toJSON: () => endless };
    expect(() => canonicalJson({ b: endless, a: 1 })).toThrow(RangeError);
  });

  test('key order and query parameter order do not change it', () => {
    expect(defaultFingerprint('POST', '/a?x=1&y=2', { a: 1, b: 2 })).toBe(
      defaultFingerprint('POST', '/a?y=2&x=1', { b: 2, a: 1 }),
    );
  });

  test.each([
    ['method', ['PUT', '/a', { a: 1 }]],
    ['path', ['POST', '/b', { a: 1 }]],
    ['query', ['POST', '/a?x=1', { a: 1 }]],
    ['body', ['POST', '/a', { a: 2 }]],
    ['no body', ['POST', '/a', undefined]],
  ] as const)('a different %s changes it', (_label, args) => {
    expect(defaultFingerprint(...(args as readonly [string, string, unknown]))).not.toBe(
      defaultFingerprint('POST', '/a', { a: 1 }),
    );
  });

  test('a raw body is hashed as bytes: a Buffer and the same string agree', () => {
    expect(defaultFingerprint('POST', '/a', Buffer.from('hello'))).toBe(
      defaultFingerprint('POST', '/a', 'hello'),
    );
    expect(defaultFingerprint('POST', '/a', Buffer.from([1, 2]))).not.toBe(
      defaultFingerprint('POST', '/a', Buffer.from([1, 3])),
    );
  });

  test('path and query cannot be confused with each other', () => {
    expect(defaultFingerprint('POST', '/a?b', undefined)).not.toBe(
      defaultFingerprint('POST', '/a%3Fb', undefined),
    );
  });
});
