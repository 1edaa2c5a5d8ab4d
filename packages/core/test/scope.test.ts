import { Idempotency, IdempotencyOptionsError, MemoryStore, scopeByHeader } from '@oncely/core';

const secret = 'a-test-secret-of-32-characters!!';
const ok = { status: 201, headers: {}, body: Buffer.from('{"id":1}') };

describe('scopeByHeader', () => {
  test('a keyed hash: same value same scope, other value or other secret another scope, never the value', () => {
    const scope = scopeByHeader('Authorization', { secret });
    const a = scope({ headers: { authorization: 'Bearer key_live_A' } });
    expect(a).toMatch(/^authorization:[A-Za-z0-9_-]{43}$/);
    expect(a).not.toContain('key_live_A');
    expect(scope({ headers: { authorization: 'Bearer key_live_A' } })).toBe(a);
    expect(scope({ headers: { authorization: 'Bearer key_live_B' } })).not.toBe(a);
    expect(
      scopeByHeader('authorization', { secret: Buffer.from(`${secret}-other`) })({
        headers: { authorization: 'Bearer key_live_A' },
      }),
    ).not.toBe(a);
  });

  test('reads web Headers as well as Node header objects, and gives requests without it one scope', () => {
    const scope = scopeByHeader('x-api-key', { secret });
    const node = scope({ headers: { 'x-api-key': 'k1' } });
    expect(scope({ headers: new Headers({ 'X-Api-Key': 'k1' }) })).toBe(node);
    expect(scope({ headers: {} })).toBe('x-api-key:none');
    expect(scope({ headers: new Headers() })).toBe('x-api-key:none');
  });

  test('the secret is copied: changing the caller buffer later changes nothing', () => {
    const bytes = Buffer.from(secret);
    const scope = scopeByHeader('authorization', { secret: bytes });
    const before = scope({ headers: { authorization: 'k' } });
    bytes.fill(0);
    expect(scope({ headers: { authorization: 'k' } })).toBe(before);
  });

  test.each([
    [{}, /at least 16 bytes/],
    [{ secret: 'short' }, /got 5 bytes/],
    [{ secret: 42 }, /got number/],
    [undefined, /ONCELY_SCOPE_SECRET/],
  ])('secret %p is refused with the fix', (options, message) => {
    expect(() => scopeByHeader('authorization', options as never)).toThrow(IdempotencyOptionsError);
    expect(() => scopeByHeader('authorization', options as never)).toThrow(message);
  });

  test('a header name that is not one is refused', () => {
    expect(() => scopeByHeader('bad header', { secret })).toThrow(/scopeByHeader\(header\)/);
  });

  test('in the engine: two API keys are two records, and the stored key holds no credential', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store, scope: scopeByHeader('authorization', { secret }) });
    const keys: string[] = [];
    const run = async (apiKey: string) => {
      const decision = await engine.handle({
        method: 'POST',
        url: '/charges',
        headers: { 'idempotency-key': 'order-1', authorization: `Bearer ${apiKey}` },
        body: {},
        request: { headers: { authorization: `Bearer ${apiKey}` } },
      });
      if (decision.action === 'execute') {
        keys.push(decision.execution.key);
        await decision.execution.complete(ok);
      }
      return decision.action;
    };
    expect(await run('sk_A_0123456789')).toBe('execute');
    expect(await run('sk_B_0123456789')).toBe('execute');
    expect(await run('sk_A_0123456789')).toBe('respond');
    expect(keys).toHaveLength(2);
    // Read back from the store itself: exactly the two records, and no credential in either key.
    expect([...store.keys()].sort()).toEqual([...keys].sort());
    for (const key of store.keys()) {
      expect(key).toMatch(/^authorization:[A-Za-z0-9_-]{43} order-1$/);
      expect(key).not.toContain('sk_');
      expect((await store.get(key))?.state).toBe('completed');
    }
  });
});
