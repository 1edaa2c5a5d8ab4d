// What each settlement turns into in SQS calls, through the real @aws-sdk/client-sqs command classes sent to a
// client that records them (the server-backed tests are in consumer.test.ts): option checks, the FIFO group stop,
// the dead-letter send-then-delete and its failure, and sqs-consumer's handleMessageTimeout.
import type { Message, SQSClient } from '@aws-sdk/client-sqs';
import { IdempotencyOptionsError, MemoryStore, PermanentError } from '@oncely/core';
import {
  DEAD_LETTER_REASON_ATTRIBUTE,
  idempotentHandleMessage,
  idempotentHandleMessageBatch,
  idempotentSqsProcessor,
  type SqsConsumerOptions,
  type SqsSettledEvent,
} from '@oncely/sqs';
import { sleep, waitUntil } from '@oncely/testing';

interface Sent {
  command: string;
  input: Record<string, unknown>;
}

/** An SQSClient stand-in that records what the wrapper sends; `failing` names commands that reject. */
function recordingClient(failing: Set<string> = new Set()) {
  const sent: Sent[] = [];
  const client = {
    async send(command: { constructor: { name: string }; input: Record<string, unknown> }) {
      const name = command.constructor.name.replace(/Command$/, '');
      sent.push({ command: name, input: command.input });
      if (failing.has(name)) throw new Error(`${name} refused`);
      return {};
    },
  };
  return { sent, sqs: client as unknown as SQSClient };
}

const QUEUE = 'http://sqs.test/000000000000/orders';
const FIFO = 'http://sqs.test/000000000000/orders.fifo';
const DLQ = 'http://sqs.test/000000000000/orders-dead';

let n = 0;
function message(
  body: string,
  opts: { key?: string; receives?: number; group?: string; id?: string } = {},
): Message {
  n++;
  return {
    MessageId: opts.id ?? `m-${n}`,
    ReceiptHandle: `rh-${n}`,
    Body: body,
    Attributes: {
      ApproximateReceiveCount: String(opts.receives ?? 1),
      ...(opts.group === undefined ? {} : { MessageGroupId: opts.group }),
    },
    MessageAttributes:
      opts.key === undefined ? {} : { 'Idempotency-Key': { DataType: 'String', StringValue: opts.key } },
  };
}

function options(sqs: SQSClient, extra: Partial<SqsConsumerOptions> = {}): SqsConsumerOptions {
  return {
    sqs,
    queueUrl: QUEUE,
    store: new MemoryStore(),
    retryDelay: '5s',
    inProgressDelay: '2s',
    ...extra,
  };
}

describe('options are checked once, naming the option', () => {
  const { sqs } = recordingClient();
  const cases: [string, Partial<SqsConsumerOptions>][] = [
    ['sqs', { sqs: {} as SQSClient }],
    ['queueUrl', { queueUrl: '' }],
    ['deadLetterQueueUrl', { deadLetterQueueUrl: QUEUE }],
    ['visibilityTimeout', { visibilityTimeout: '500ms' }],
    ['lockTimeout', { visibilityTimeout: '10s', lockTimeout: '20s' }],
    ['key', { key: { header: 'x' } as unknown as SqsConsumerOptions['key'] }],
    ['handleMessageTimeout', { handleMessageTimeout: 'soon' as unknown as number }],
    ['channel', { channel: 1 } as unknown as Partial<SqsConsumerOptions>],
  ];
  test.each(cases)('%s', (option, extra) => {
    for (const wrap of [idempotentHandleMessage, idempotentHandleMessageBatch, idempotentSqsProcessor]) {
      let thrown: unknown;
      try {
        wrap(() => undefined, options(sqs, extra));
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toBeInstanceOf(IdempotencyOptionsError);
      expect((thrown as IdempotencyOptionsError).option).toBe(option);
    }
  });
});

test('handleMessage: done → handed back to sqs-consumer; a duplicate under another MessageId is not run', async () => {
  const { sent, sqs } = recordingClient();
  let runs = 0;
  const handle = idempotentHandleMessage(() => {
    runs++;
  }, options(sqs));
  const first = message('{"id":1}', { key: 'order-1' });
  const again = message('{"id":1}', { key: 'order-1' });
  expect(await handle(first)).toBe(first);
  expect(await handle(again)).toBe(again);
  expect(runs).toBe(1);
  // sqs-consumer deletes what is returned: the wrapper sent nothing itself.
  expect(sent).toEqual([]);
});

test('handleMessage: a failure sets the visibility to the retry delay; the last attempt goes to the dead-letter queue', async () => {
  const { sent, sqs } = recordingClient();
  const events: SqsSettledEvent[] = [];
  const handle = idempotentHandleMessage(
    () => {
      throw new Error('boom');
    },
    options(sqs, { maxAttempts: 3, deadLetterQueueUrl: DLQ, onSettled: (e) => events.push(e) }),
  );
  const first = message('a', { key: 'k-fail', receives: 1 });
  expect(await handle(first)).toBeUndefined();
  expect(sent).toEqual([
    {
      command: 'ChangeMessageVisibility',
      input: { QueueUrl: QUEUE, ReceiptHandle: first.ReceiptHandle, VisibilityTimeout: 5 },
    },
  ]);
  sent.length = 0;
  const last = message('a', { key: 'k-fail', receives: 3 });
  expect(await handle(last)).toBeUndefined();
  expect(sent.map((s) => s.command)).toEqual(['SendMessage', 'DeleteMessage']);
  expect(sent[0]?.input).toMatchObject({
    QueueUrl: DLQ,
    MessageBody: 'a',
    MessageAttributes: {
      'Idempotency-Key': { DataType: 'String', StringValue: 'k-fail' },
      [DEAD_LETTER_REASON_ATTRIBUTE]: { DataType: 'String', StringValue: 'retries-exhausted' },
    },
  });
  expect(sent[1]?.input).toEqual({ QueueUrl: QUEUE, ReceiptHandle: last.ReceiptHandle });
  expect(events.map((e) => [e.action, e.reason, e.failures])).toEqual([
    ['retry', 'failed', 1],
    ['dead-letter', 'retries-exhausted', 3],
  ]);
});

test("without deadLetterQueueUrl a dead letter is left to the queue's redrive policy: visible again at once", async () => {
  const { sent, sqs } = recordingClient();
  const handle = idempotentHandleMessage(() => {
    throw new PermanentError('never');
  }, options(sqs));
  const m = message('a', { key: 'k-perm' });
  expect(await handle(m)).toBeUndefined();
  expect(sent).toEqual([
    {
      command: 'ChangeMessageVisibility',
      input: { QueueUrl: QUEUE, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 },
    },
  ]);
});

test('a dead-letter send that fails keeps the message: it comes back after the retry delay', async () => {
  const { sent, sqs } = recordingClient(new Set(['SendMessage']));
  const events: SqsSettledEvent[] = [];
  const handle = idempotentHandleMessage(
    () => {
      throw new PermanentError('never');
    },
    options(sqs, { deadLetterQueueUrl: DLQ, onSettled: (e) => events.push(e) }),
  );
  const m = message('a', { key: 'k-dlq-down' });
  expect(await handle(m)).toBeUndefined();
  expect(sent.map((s) => s.command)).toEqual(['SendMessage', 'ChangeMessageVisibility']);
  expect(sent[1]?.input.VisibilityTimeout).toBe(5);
  expect(events[0]).toMatchObject({ action: 'retry', reason: 'failed', delayMs: 5000 });
});

test('a message whose key is in progress elsewhere comes back after inProgressDelay, not run', async () => {
  const { sent, sqs } = recordingClient();
  let runs = 0;
  const store = new MemoryStore();
  const work = async () => {
    runs++;
    await sleep(300);
  };
  // Two consumers sharing the store: within one, a duplicate waits for the first instead.
  const handle = idempotentHandleMessage(work, options(sqs, { store }));
  const elsewhere = idempotentHandleMessage(work, options(sqs, { store }));
  const first = message('x', { key: 'k-held' });
  const dup = message('x', { key: 'k-held' });
  const running = elsewhere(first);
  await sleep(50);
  expect(await handle(dup)).toBeUndefined();
  expect(await running).toBe(first);
  expect(runs).toBe(1);
  expect(sent).toEqual([
    {
      command: 'ChangeMessageVisibility',
      input: { QueueUrl: QUEUE, ReceiptHandle: dup.ReceiptHandle, VisibilityTimeout: 2 },
    },
  ]);
});

test('handleMessageTimeout: an answer sqs-consumer no longer waits for is deleted by the wrapper', async () => {
  const { sent, sqs } = recordingClient();
  const handle = idempotentHandleMessage(() => sleep(150), options(sqs, { handleMessageTimeout: 100 }));
  const m = message('slow', { key: 'k-slow' });
  expect(await handle(m)).toBeUndefined();
  expect(sent).toEqual([
    { command: 'DeleteMessage', input: { QueueUrl: QUEUE, ReceiptHandle: m.ReceiptHandle } },
  ]);
});

test('handleMessageBatch on FIFO: a group stops at its first message not acknowledged; other groups go on', async () => {
  const { sent, sqs } = recordingClient();
  const ran: string[] = [];
  const events: SqsSettledEvent[] = [];
  const handle = idempotentHandleMessageBatch(
    (m) => {
      ran.push(m.Body as string);
      if (m.Body === 'a1') throw new Error('a1 fails');
    },
    options(sqs, { queueUrl: FIFO, onSettled: (e) => events.push(e) }),
  );
  const a1 = message('a1', { key: 'a1', group: 'A' });
  const a2 = message('a2', { key: 'a2', group: 'A' });
  const b1 = message('b1', { key: 'b1', group: 'B' });
  const b2 = message('b2', { key: 'b2', group: 'B' });
  const toDelete = await handle([a1, b1, a2, b2]);
  expect(toDelete).toEqual([b1, b2]);
  expect(ran.sort()).toEqual(['a1', 'b1', 'b2']);
  // a2 comes back with a1, not before it.
  expect(
    sent
      .filter((s) => s.command === 'ChangeMessageVisibility')
      .map((s) => [s.input.ReceiptHandle, s.input.VisibilityTimeout]),
  ).toEqual([
    [a1.ReceiptHandle, 5],
    [a2.ReceiptHandle, 5],
  ]);
  expect(events.find((e) => e.message === a2)).toMatchObject({
    action: 'delay',
    reason: 'group-stopped',
    delayMs: 5000,
  });
});

test('handleMessageBatch on a standard queue: every message is decided on its own', async () => {
  const { sqs } = recordingClient();
  const handle = idempotentHandleMessageBatch((m) => {
    if (m.Body === 'bad') throw new Error('bad');
  }, options(sqs));
  const ok1 = message('ok1', { key: 's1' });
  const bad = message('bad', { key: 's2' });
  const ok2 = message('ok2', { key: 's3' });
  expect(await handle([ok1, bad, ok2])).toEqual([ok1, ok2]);
});

test('processor: deletes what is done, and on FIFO runs a receive in group order, stopping a group', async () => {
  const { sent, sqs } = recordingClient();
  const ran: string[] = [];
  const process = idempotentSqsProcessor(
    async (m) => {
      ran.push(m.Body as string);
      await sleep(10);
      if (m.Body === 'a2') throw new Error('a2 fails');
    },
    options(sqs, { queueUrl: FIFO }),
  );
  const a1 = message('a1', { key: 'p-a1', group: 'A' });
  const a2 = message('a2', { key: 'p-a2', group: 'A' });
  const a3 = message('a3', { key: 'p-a3', group: 'A' });
  const b1 = message('b1', { key: 'p-b1', group: 'B' });
  const events = await Promise.all([a1, a2, a3, b1].map(process));
  expect(events.map((e) => `${e.action}:${e.reason}`)).toEqual([
    'ack:executed',
    'retry:failed',
    'delay:group-stopped',
    'ack:executed',
  ]);
  expect(ran.filter((b) => b.startsWith('a'))).toEqual(['a1', 'a2']);
  expect(
    sent
      .filter((s) => s.command === 'DeleteMessage')
      .map((s) => s.input.ReceiptHandle)
      .sort(),
  ).toEqual([a1.ReceiptHandle, b1.ReceiptHandle].sort());
  // The next receive of the group starts afresh.
  const again = await process(message('a2', { key: 'p-a2-b', group: 'A' }));
  expect(again.action).toBe('retry');
});

test('no ApproximateReceiveCount: attempts cannot be counted, said once in the log', async () => {
  const { sqs } = recordingClient();
  const warnings: string[] = [];
  const logger = {
    debug() {},
    info() {},
    warn(_o: unknown, msg: string) {
      warnings.push(msg);
    },
    error() {},
  };
  const handle = idempotentHandleMessage(
    () => {
      throw new Error('x');
    },
    options(sqs, { logger }),
  );
  for (let i = 0; i < 3; i++) {
    const m = message('a', { key: `nc-${i}` });
    delete m.Attributes;
    await handle(m);
  }
  expect(warnings.filter((w) => w.includes('ApproximateReceiveCount'))).toHaveLength(1);
});

test('handleMessage on FIFO: the messages of a receive, handed over together, run in group order and stop', async () => {
  const { sqs } = recordingClient();
  const ran: string[] = [];
  let running = 0;
  let overlapped = false;
  const handle = idempotentHandleMessage(
    async (m) => {
      running++;
      if (running > 1) overlapped = true;
      ran.push(m.Body as string);
      await sleep(20);
      running--;
      if (m.Body === 'a2') throw new Error('a2 fails');
    },
    options(sqs, { queueUrl: FIFO }),
  );
  const batch = ['a1', 'a2', 'a3', 'a4'].map((b) => message(b, { key: `h-${b}`, group: 'A' }));
  // As sqs-consumer does: every message of the receive handed over at once.
  const returned = await Promise.all(batch.map(handle));
  expect(ran).toEqual(['a1', 'a2']);
  expect(overlapped).toBe(false);
  expect(returned).toEqual([batch[0], undefined, undefined, undefined]);
});

test('one heartbeat: each lease renewal sets the visibility to visibilityTimeout again', async () => {
  const { sent, sqs } = recordingClient();
  const handle = idempotentHandleMessage(() => sleep(2600), options(sqs, { visibilityTimeout: '3s' }));
  const m = message('slow', { key: 'k-heartbeat' });
  expect(await handle(m)).toBe(m);
  // The lease (lockTimeout = visibilityTimeout = 3s) is renewed every second: twice while the handler ran.
  const extended = sent.filter((s) => s.command === 'ChangeMessageVisibility');
  expect(extended.length).toBeGreaterThanOrEqual(2);
  for (const s of extended) {
    expect(s.input).toEqual({ QueueUrl: QUEUE, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 3 });
  }
});

describe('standard queue: messages with one key in one receive run one after another', () => {
  const wrappers: [
    string,
    (h: () => Promise<void>, o: SqsConsumerOptions) => (ms: Message[]) => Promise<unknown>,
  ][] = [
    [
      'handleMessage, handed over together',
      (h, o) => {
        const handle = idempotentHandleMessage(h, o);
        return async (ms) => (await Promise.all(ms.map(handle))).filter((m) => m !== undefined);
      },
    ],
    ['handleMessageBatch', (h, o) => idempotentHandleMessageBatch(h, o)],
  ];
  test.each(wrappers)('%s: the second replays and is deleted in this receive', async (name, wrap) => {
    const { sent, sqs } = recordingClient();
    const events: SqsSettledEvent[] = [];
    let runs = 0;
    const handle = wrap(
      async () => {
        runs++;
        await sleep(50);
      },
      options(sqs, { onSettled: (e) => events.push(e) }),
    );
    const a = message('x', { key: `dup-${name}`, id: 'a' });
    const b = message('x', { key: `dup-${name}`, id: 'b' });
    const deleted = (await handle([a, b])) as Message[];
    expect(runs).toBe(1);
    expect(deleted.map((m) => m.MessageId)).toEqual(['a', 'b']);
    expect(events.map((e) => `${e.action}/${e.reason}`).sort()).toEqual(['ack/executed', 'ack/replayed']);
    expect(sent).toEqual([]);
  });
});

describe('FIFO: messages waiting behind a running one of their group stay invisible', () => {
  // A group of 12 in one receive: 11 wait behind the first, more than one ChangeMessageVisibilityBatch holds.
  const wrappers: [
    string,
    (handler: (m: Message) => unknown, o: SqsConsumerOptions) => (ms: Message[]) => Promise<unknown>,
  ][] = [
    [
      'handleMessage',
      (h, o) => {
        const handle = idempotentHandleMessage(h, o);
        return (ms) => Promise.all(ms.map(handle));
      },
    ],
    ['handleMessageBatch', (h, o) => idempotentHandleMessageBatch(h, o)],
  ];
  test.each(wrappers)('%s: every waiting receipt handle is extended while it waits', async (name, wrap) => {
    const started = new Set<string>();
    const extendedWhileWaiting = new Set<string>();
    const extendedAfterStart: string[] = [];
    const { sent, sqs } = recordingClient();
    const send = sqs.send.bind(sqs);
    (sqs as unknown as { send: typeof send }).send = (async (command: {
      constructor: { name: string };
      input: Record<string, unknown>;
    }) => {
      if (command.constructor.name === 'ChangeMessageVisibilityBatchCommand') {
        const entries = command.input.Entries as { ReceiptHandle: string; VisibilityTimeout: number }[];
        expect(entries.length).toBeLessThanOrEqual(10);
        for (const entry of entries) {
          expect(entry.VisibilityTimeout).toBe(1);
          if (started.has(entry.ReceiptHandle)) extendedAfterStart.push(entry.ReceiptHandle);
          else extendedWhileWaiting.add(entry.ReceiptHandle);
        }
      }
      return send(command as never);
    }) as typeof send;
    const group = `g-wait-${name}`;
    const messages = Array.from({ length: 12 }, (_, i) => message(`b${i}`, { key: `${group}-${i}`, group }));
    const handled = wrap(
      async (m) => {
        started.add(m.ReceiptHandle as string);
        if (m === messages[0]) await sleep(1200);
      },
      options(sqs, { queueUrl: FIFO, visibilityTimeout: '1s' }),
    );
    await handled(messages);
    expect([...started]).toEqual(messages.map((m) => m.ReceiptHandle));
    expect([...extendedWhileWaiting].sort()).toEqual(
      messages
        .slice(1)
        .map((m) => m.ReceiptHandle as string)
        .sort(),
    );
    expect(extendedAfterStart).toEqual([]);
    expect(sent.filter((s) => s.command === 'ChangeMessageVisibilityBatch').length).toBeGreaterThanOrEqual(2);
  });

  test('a failing ChangeMessageVisibilityBatch is logged, not thrown', async () => {
    const { sqs } = recordingClient(new Set(['ChangeMessageVisibilityBatch']));
    const errors: string[] = [];
    const logger = {
      debug() {},
      info() {},
      warn() {},
      error: (_o: unknown, msg: string) => errors.push(msg),
    };
    const handle = idempotentHandleMessageBatch(
      async (m) => {
        if (m.Body === 'slow') await sleep(800);
      },
      options(sqs, { queueUrl: FIFO, visibilityTimeout: '1s', logger }),
    );
    const a = message('slow', { key: 'k-wait-fail-a', group: 'g-wait-fail' });
    const b = message('fast', { key: 'k-wait-fail-b', group: 'g-wait-fail' });
    expect(await handle([a, b])).toEqual([a, b]);
    expect(errors.some((e) => e.includes('ChangeMessageVisibilityBatch failed'))).toBe(true);
  });
});

test('each message is read into one view, for its key, its order and its fingerprint', async () => {
  const { sqs } = recordingClient();
  const handle = idempotentHandleMessage(() => undefined, options(sqs));
  const m = message('x', { key: 'k-one-view' });
  const attributes = m.MessageAttributes;
  const system = m.Attributes;
  const reads = { attributes: 0, system: 0 };
  Object.defineProperty(m, 'MessageAttributes', {
    get: () => {
      reads.attributes++;
      return attributes;
    },
  });
  Object.defineProperty(m, 'Attributes', {
    get: () => {
      reads.system++;
      return system;
    },
  });
  expect(await handle(m)).toBe(m);
  // One view (attributes read once); the system attributes by that view and one count of failed attempts.
  expect(reads).toEqual({ attributes: 1, system: 2 });
});

test("sqs-consumer's terminateVisibilityTimeout undoes the wrapper's delays when its DeleteMessageBatch fails", async () => {
  // Why the docs say to leave terminateVisibilityTimeout unset: the wrapper never throws, sqs-consumer's own call does.
  const { Consumer } = await import('sqs-consumer');
  const failed = message('fails', { key: 'k-terminate-a' });
  const ok = message('ok', { key: 'k-terminate-b' });
  const { sent, sqs } = recordingClient(new Set(['DeleteMessageBatch']));
  const send = sqs.send.bind(sqs);
  let received = false;
  (sqs as unknown as { send: typeof send }).send = (async (command: { constructor: { name: string } }) => {
    if (command.constructor.name !== 'ReceiveMessageCommand') return send(command as never);
    if (received) await sleep(100);
    const first = !received;
    received = true;
    return { Messages: first ? [failed, ok] : [] };
  }) as typeof send;
  const consumer = Consumer.create({
    queueUrl: QUEUE,
    sqs,
    terminateVisibilityTimeout: true,
    handleMessageBatch: idempotentHandleMessageBatch((m) => {
      if (m === failed) throw new Error('fails');
    }, options(sqs)),
  });
  consumer.on('error', () => undefined);
  consumer.start();
  try {
    await waitUntil(
      () => sent.some((s) => s.command === 'ChangeMessageVisibilityBatch'),
      'sqs-consumer undoes',
    );
  } finally {
    consumer.stop();
  }
  const commands = sent.map((s) => s.command);
  // The wrapper delayed the failed message by retryDelay, then sqs-consumer made the whole receive visible at once.
  expect(commands.indexOf('ChangeMessageVisibility')).toBeLessThan(
    commands.indexOf('ChangeMessageVisibilityBatch'),
  );
  const undo = sent.find((s) => s.command === 'ChangeMessageVisibilityBatch')?.input.Entries as {
    ReceiptHandle: string;
    VisibilityTimeout: number;
  }[];
  expect(undo.map((e) => [e.ReceiptHandle, e.VisibilityTimeout])).toEqual([
    [failed.ReceiptHandle, 0],
    [ok.ReceiptHandle, 0],
  ]);
});
