import { Idempotency, MemoryStore } from '@oncely/core';
import type { HttpDecision, HttpRequestInput } from '@oncely/core/adapter';
import { closedByClient, ResponseCapture } from '@oncely/core/node';

// The capture the Node adapters share: what it holds, and the one decision it takes for each way a response ends.

function input(key: string): HttpRequestInput<unknown> {
  return { method: 'POST', url: '/charges', headers: { 'idempotency-key': key }, body: {}, request: {} };
}

function executionOf(decision: HttpDecision) {
  if (decision.action !== 'execute') throw new Error(`expected execute, got ${decision.action}`);
  return decision.execution;
}

const head = { statusCode: 200, getHeaders: () => ({ 'content-type': 'text/plain' }) };

async function setup(maxBodyBytes = 8) {
  const store = new MemoryStore();
  const engine = new Idempotency({ store, maxBodyBytes });
  const capture = new ResponseCapture(executionOf(await engine.handle(input('k'))), head);
  const next = async () => engine.handle(input('k'));
  return { capture, next };
}

describe('ResponseCapture', () => {
  test('holds a copy of what it is given: a buffer refilled afterwards changes nothing stored', async () => {
    const { capture, next } = await setup();
    const buffer = Buffer.from('abc');
    expect(capture.hold(buffer)).toBe(true);
    expect(capture.hold('de')).toBe(true);
    buffer.fill(0x78);
    const body = capture.body();
    expect(body.toString()).toBe('abcde');
    await capture.finished(201, head.getHeaders(), body);
    const replay = await next();
    expect(replay.action).toBe('respond');
    if (replay.action === 'respond') expect(Buffer.from(replay.response.body).toString()).toBe('abcde');
  });

  test('over the limit: hands back what it held, then keeps the status only (a replay is a 410)', async () => {
    const { capture, next } = await setup(4);
    expect(capture.hold('abc')).toBe(true);
    expect(capture.hold('defg')).toBe(false);
    expect(capture.streaming).toBe(true);
    expect(Buffer.concat(capture.drain()).toString()).toBe('abcdefg');
    expect(capture.hold('more')).toBe(false);
    expect(capture.drain()).toEqual([]);
    await capture.finished(200, head.getHeaders(), undefined);
    const replay = await next();
    expect(replay.action === 'respond' && replay.response.status).toBe(410);
  });

  test('a handler that fails mid-stream, over the limit: the key is released', async () => {
    const { capture, next } = await setup(4);
    capture.began();
    capture.hold('abcdefgh');
    await capture.failed(new Error('the source failed'));
    expect(capture.decided).toBe(true);
    expect((await next()).action).toBe('execute');
  });

  test('the client left before the answer began: nothing until it begins, then executed', async () => {
    const { capture, next } = await setup();
    capture.clientLeft();
    expect(capture.decided).toBe(false);
    expect(capture.began()).toBe(false);
    expect(capture.decided).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 10));
    const retry = await next();
    expect(retry.action === 'respond' && retry.response.status).toBe(410);
  });

  test('the client left after the answer began: executed at once', async () => {
    const { capture, next } = await setup();
    expect(capture.began()).toBe(true);
    capture.hold('ab');
    capture.clientLeft();
    expect(capture.decided).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 10));
    const retry = await next();
    expect(retry.action === 'respond' && retry.response.status).toBe(410);
  });

  // A stream payload (Fastify's onSend, Koa's ctx.body), held up to the limit, then sent on by `sendRest`.
  async function* source(chunks: string[], fail?: Error) {
    for (const chunk of chunks) yield chunk;
    if (fail !== undefined) throw fail;
  }
  const settled = () => new Promise((resolve) => setTimeout(resolve, 10));

  test('holdStream: a stream within the limit is held whole, and stored with its body', async () => {
    const { capture, next } = await setup();
    expect(await capture.holdStream(source(['abc', 'de']))).toBeUndefined();
    await capture.finished(200, head.getHeaders(), capture.body());
    const replay = await next();
    expect(replay.action === 'respond' && Buffer.from(replay.response.body).toString()).toBe('abcde');
  });

  test('sendRest: a stream over the limit is sent whole, and its end keeps the status only', async () => {
    const { capture, next } = await setup(4);
    const rest = await capture.holdStream(source(['abc', 'defg', 'hi']));
    expect(rest).toBeDefined();
    const sent: Buffer[] = [];
    for await (const chunk of capture.sendRest(
      rest as AsyncIterator<unknown>,
      200,
      head.getHeaders(),
      () => {},
    ))
      sent.push(chunk as Buffer);
    expect(Buffer.concat(sent).toString()).toBe('abcdefghi');
    expect(capture.decided).toBe(true);
    const replay = await next();
    expect(replay.action === 'respond' && replay.response.status).toBe(410);
  });

  test('sendRest: a source that fails after part was sent releases the key', async () => {
    const { capture, next } = await setup(4);
    const rest = await capture.holdStream(source(['abcdefg', 'h'], new Error('the source failed')));
    const body = capture.sendRest(rest as AsyncIterator<unknown>, 200, head.getHeaders(), () => {});
    await expect(
      (async () => {
        for await (const _ of body);
      })(),
    ).rejects.toThrow('the source failed');
    expect((await next()).action).toBe('execute');
  });

  test('sendRest: a stream destroyed before it was read stops the source and is recorded as executed', async () => {
    const { capture, next } = await setup(4);
    const rest = await capture.holdStream(source(['abcdefg', 'h']));
    let stopped = false;
    const body = capture.sendRest(rest as AsyncIterator<unknown>, 200, head.getHeaders(), () => {
      stopped = true;
    });
    body.destroy();
    expect(capture.decided).toBe(true);
    expect(stopped).toBe(true);
    await settled();
    const retry = await next();
    expect(retry.action === 'respond' && retry.response.status).toBe(410);
  });

  test('closedByClient: an ended or reset socket is the client; one this server destroyed is not', () => {
    expect(closedByClient({ readableEnded: true, errored: null })).toBe(true);
    expect(closedByClient({ readableEnded: false, errored: new Error('ECONNRESET') })).toBe(true);
    expect(closedByClient({ readableEnded: false, errored: null })).toBe(false);
  });
});
