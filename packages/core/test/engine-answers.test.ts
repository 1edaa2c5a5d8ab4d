import { Idempotency, MemoryStore, PROBLEM_TYPES } from '../src';

// What the engine decides for the fetch adapters, which only translate its answers into a Response.
describe('the engine answers what an adapter used to decide itself', () => {
  test('passes(): a method outside methods, or no key when none is required, is left alone', () => {
    const optional = new Idempotency({ store: new MemoryStore() });
    expect(optional.passes('GET', true)).toBe(true);
    expect(optional.passes('POST', false)).toBe(true);
    expect(optional.passes('POST', true)).toBe(false);
    const required = new Idempotency({ store: new MemoryStore(), required: true });
    expect(required.passes('POST', false)).toBe(false);
    expect(required.passes('DELETE', false)).toBe(true);
  });

  test('unreadableBody(): a 400 body-unreadable problem, logged at warn', () => {
    const warnings: unknown[] = [];
    const logger = { debug() {}, info() {}, warn: (o: unknown) => warnings.push(o), error() {} };
    const engine = new Idempotency({ store: new MemoryStore(), logger });
    const answer = engine.unreadableBody(new Error('stream cut'));
    expect(answer.status).toBe(400);
    expect(JSON.parse(Buffer.from(answer.body).toString('utf8')).type).toBe(PROBLEM_TYPES.bodyUnreadable);
    expect(warnings).toHaveLength(1);
  });

  test('clientGone(): the key is released and the answer is a 499 without a body', async () => {
    const store = new MemoryStore();
    const engine = new Idempotency({ store });
    const input = {
      method: 'POST',
      url: '/x',
      headers: { 'idempotency-key': 'k' },
      body: undefined,
      request: {},
    };
    const decision = await engine.handle(input);
    if (decision.action !== 'execute') throw new Error(`expected execute, got ${decision.action}`);
    const answer = await decision.execution.clientGone();
    expect(answer.status).toBe(499);
    expect(answer.body.byteLength).toBe(0);
    // Released: the retry runs.
    expect((await engine.handle(input)).action).toBe('execute');
  });
});
