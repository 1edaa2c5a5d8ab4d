/**
 * The SQS test server harness (startSqsServer, createTestQueue), and what the server does where oncely relies on
 * SQS, with the real @aws-sdk/client-sqs. What fauxqs does differently from SQS is written down in
 * docs/development.md ("SQS test server"); the tests below that pin a fauxqs-only behaviour say so.
 *
 * @services sqs-server
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import {
  ChangeMessageVisibilityBatchCommand,
  ChangeMessageVisibilityCommand,
  DeleteMessageBatchCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  type Message,
  type MessageAttributeValue,
  ReceiveMessageCommand,
  type ReceiveMessageCommandInput,
  SendMessageBatchCommand,
  SendMessageCommand,
  SQSClient,
} from '@aws-sdk/client-sqs';
import { services } from '../jest/services.cjs';
import {
  createTestQueue,
  type SqsServer,
  sqsServerNode,
  sqsServerProblem,
  startSqsServer,
  type TestQueue,
} from '../src/sqs-server';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let server: SqsServer;
let sqs: SQSClient;
const queues: TestQueue[] = [];

beforeAll(async () => {
  server = await startSqsServer();
  sqs = server.client();
});
afterAll(async () => {
  await Promise.all(queues.map((queue) => queue.delete().catch(() => {})));
  sqs?.destroy();
  await server?.stop();
});

async function queue(options: Parameters<typeof createTestQueue>[1] = {}): Promise<TestQueue> {
  const created = await createTestQueue(sqs, { prefix: 'sqs-server-test', ...options });
  queues.push(created);
  return created;
}

/** One ReceiveMessage, with the receive count asked for; [] when nothing is there. */
async function receive(url: string, input: Partial<ReceiveMessageCommandInput> = {}): Promise<Message[]> {
  const { Messages } = await sqs.send(
    new ReceiveMessageCommand({
      QueueUrl: url,
      MessageSystemAttributeNames: ['All'],
      MessageAttributeNames: ['All'],
      WaitTimeSeconds: 0,
      ...input,
    }),
  );
  return Messages ?? [];
}

/** Receives until `count` messages came or `timeoutMs` passed (long polls of at most 1 s). */
async function receiveAll(url: string, count: number, timeoutMs = 15_000): Promise<Message[]> {
  const got: Message[] = [];
  const deadline = Date.now() + timeoutMs;
  while (got.length < count && Date.now() < deadline) {
    got.push(
      ...(await receive(url, { MaxNumberOfMessages: Math.min(10, count - got.length), WaitTimeSeconds: 1 })),
    );
  }
  return got;
}

// fauxqs names it AWS.SimpleQueueService.InvalidParameterValue, the code of SQS's query protocol.
const INVALID_PARAMETER = expect.stringMatching(/InvalidParameterValue$/);

const receiveCount = (message: Message | undefined) => Number(message?.Attributes?.ApproximateReceiveCount);

async function answers(endpoint: string): Promise<boolean> {
  try {
    await fetch(`${endpoint}/health`, { signal: AbortSignal.timeout(2000) });
    return true;
  } catch {
    return false;
  }
}

describe('startSqsServer', () => {
  test('starts fauxqs on a free loopback port; it answers /health and the SDK', async () => {
    expect(server.kind).toBe('fauxqs');
    expect(server.endpoint).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(server.env).toEqual({
      SQS_ENDPOINT: server.endpoint,
      AWS_ENDPOINT_URL_SQS: server.endpoint,
      AWS_REGION: 'us-east-1',
      AWS_ACCESS_KEY_ID: 'test',
      AWS_SECRET_ACCESS_KEY: 'test',
    });
    const health = await fetch(`${server.endpoint}/health`);
    expect(health.status).toBe(200);
    const q = await queue();
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'hello' }));
    expect((await receive(q.url)).map((m) => m.Body)).toEqual(['hello']);
  });

  test("queue URLs name the server's own address: a client with its endpoint from the environment works", async () => {
    const q = await queue();
    expect(q.url).toBe(`${server.endpoint}/000000000000/${q.name}`);
    // The SDK sends to the QueueUrl's host unless `endpoint` is given in code (sqs-consumer's default client).
    // The SDK reads the environment when it sends, not when the client is made: it stays set until the end.
    const saved = { ...process.env };
    Object.assign(process.env, server.env);
    const fromEnv = new SQSClient({});
    try {
      await fromEnv.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'from the environment' }));
      const { Messages } = await fromEnv.send(new ReceiveMessageCommand({ QueueUrl: q.url }));
      expect(Messages?.map((m) => m.Body)).toEqual(['from the environment']);
    } finally {
      fromEnv.destroy();
      for (const name of Object.keys(server.env)) {
        if (saved[name] === undefined) delete process.env[name];
        else process.env[name] = saved[name];
      }
    }
  });

  test('createTestQueue: unique names, FIFO, a dead-letter queue and its redrive policy; delete() removes both', async () => {
    const a = await queue({ deadLetter: { maxReceiveCount: 3 }, visibilityTimeout: 7 });
    const b = await queue({
      fifo: true,
      contentBasedDeduplication: true,
      deadLetter: { maxReceiveCount: 2 },
    });
    expect(a.name).not.toBe(b.name.replace(/\.fifo$/, ''));
    expect(b.name).toMatch(/\.fifo$/);
    expect(b.deadLetter?.name).toMatch(/-dlq\.fifo$/);
    const { Attributes: aa } = await sqs.send(
      new GetQueueAttributesCommand({ QueueUrl: a.url, AttributeNames: ['All'] }),
    );
    expect(aa?.VisibilityTimeout).toBe('7');
    expect(JSON.parse(aa?.RedrivePolicy ?? '{}')).toEqual({
      deadLetterTargetArn: a.deadLetter?.arn,
      maxReceiveCount: 3,
    });
    const { Attributes: ba } = await sqs.send(
      new GetQueueAttributesCommand({ QueueUrl: b.url, AttributeNames: ['All'] }),
    );
    expect(ba?.FifoQueue).toBe('true');
    expect(ba?.ContentBasedDeduplication).toBe('true');
    await a.delete();
    for (const name of [a.name, a.deadLetter?.name]) {
      await expect(sqs.send(new GetQueueUrlCommand({ QueueName: name }))).rejects.toMatchObject({
        name: 'QueueDoesNotExist',
      });
    }
    await a.delete(); // a second time: nothing to delete, no error
  });

  test('stop() ends the server', async () => {
    const other = await startSqsServer();
    expect(await answers(other.endpoint)).toBe(true);
    await other.stop();
    expect(await answers(other.endpoint)).toBe(false);
    await other.stop(); // idempotent
  });

  test('the server ends with the process that started it, even when that process is SIGKILLed', async () => {
    const holder = spawn(
      process.execPath,
      ['--conditions=@oncely/source', '--import', 'tsx', join(__dirname, 'fixtures', 'sqs-server-holder.ts')],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    try {
      const line = await new Promise<string>((resolve, reject) => {
        createInterface({ input: holder.stdout }).once('line', resolve);
        holder.once('exit', (code) =>
          reject(new Error(`the holder exited (${code}) before it started a server`)),
        );
      });
      const { endpoint } = JSON.parse(line) as { endpoint: string };
      expect(await answers(endpoint)).toBe(true);
      const exited = new Promise((resolve) => holder.once('exit', resolve));
      holder.kill('SIGKILL');
      await exited;
      const deadline = Date.now() + 10_000;
      while ((await answers(endpoint)) && Date.now() < deadline) await sleep(100);
      expect(await answers(endpoint)).toBe(false);
    } finally {
      holder.kill('SIGKILL');
    }
  });

  test('SQS_ENDPOINT: that server is used and left running; one that does not answer is named', async () => {
    const saved = process.env.SQS_ENDPOINT;
    const closed = await startSqsServer();
    await closed.stop();
    try {
      process.env.SQS_ENDPOINT = `${server.endpoint}/`;
      const external = await startSqsServer();
      expect(external.kind).toBe('external');
      expect(external.endpoint).toBe(server.endpoint);
      await external.stop();
      expect(await answers(server.endpoint)).toBe(true);

      process.env.SQS_ENDPOINT = closed.endpoint;
      await expect(startSqsServer()).rejects.toThrow(`SQS_ENDPOINT=${closed.endpoint} does not answer`);
    } finally {
      if (saved === undefined) delete process.env.SQS_ENDPOINT;
      else process.env.SQS_ENDPOINT = saved;
    }
  });

  test('without a Node 22.5+ to run fauxqs, the error and the @services line say what to do', () => {
    expect(() => sqsServerNode({ SQS_SERVER_NODE: '/nonexistent/node' })).toThrow(
      /SQS_SERVER_NODE=\/nonexistent\/node does not run .*SQS_ENDPOINT=http:\/\/127\.0\.0\.1:4566/,
    );
    const found = sqsServerNode({});
    expect(found.version).toMatch(/^v2[2-9]\.|^v[3-9]\d\./);
    if (!/^v22\.[5-9]|^v22\.\d\d|^v2[3-9]|^v[3-9]\d/.test(process.version)) {
      // The tests run on an older Node: the binary from npm is used, and naming the older one is refused.
      expect(found.from).toBe(`the npm package node-${process.platform}-${process.arch}`);
      const problem = sqsServerProblem({ SQS_SERVER_NODE: process.execPath });
      expect(problem).toContain(`is Node ${process.version}; fauxqs needs 22.5 or later`);
    }
    expect(sqsServerProblem({})).toBeUndefined();
  });

  test('the sqs-server service probes SQS_ENDPOINT when it is set', async () => {
    const up = services({ SQS_ENDPOINT: server.endpoint })['sqs-server'];
    expect(up?.where).toBe(`${server.endpoint.replace('http://', '')} (SQS_ENDPOINT)`);
    expect(await up?.check()).toBeUndefined();
    const down = services({ SQS_ENDPOINT: 'http://127.0.0.1:1' })['sqs-server'];
    expect(await down?.check()).toBe('ECONNREFUSED');
  });
});

describe('fauxqs does what oncely relies on SQS for', () => {
  test('a visibility timeout that runs out redelivers the message with a new receipt handle and a higher receive count', async () => {
    const q = await queue({ visibilityTimeout: 1 });
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'redeliver me' }));
    const [first] = await receive(q.url);
    expect(receiveCount(first)).toBe(1);
    expect(first?.Attributes?.ApproximateFirstReceiveTimestamp).toMatch(/^\d+$/);
    expect(await receive(q.url)).toEqual([]); // in flight: invisible
    const [second] = await receiveAll(q.url, 1);
    expect(second?.MessageId).toBe(first?.MessageId);
    expect(second?.Body).toBe('redeliver me');
    expect(second?.ReceiptHandle).not.toBe(first?.ReceiptHandle);
    expect(receiveCount(second)).toBe(2);
    expect(second?.Attributes?.ApproximateFirstReceiveTimestamp).toBe(
      first?.Attributes?.ApproximateFirstReceiveTimestamp,
    );
  });

  test("ReceiveMessage's VisibilityTimeout overrides the queue's", async () => {
    const q = await queue({ visibilityTimeout: 60 });
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'short' }));
    const [first] = await receive(q.url, { VisibilityTimeout: 1 });
    const [again] = await receiveAll(q.url, 1);
    expect(again?.MessageId).toBe(first?.MessageId);
    expect(receiveCount(again)).toBe(2);
  });

  test('ChangeMessageVisibility extends the timeout, and 0 makes the message visible at once', async () => {
    const q = await queue({ visibilityTimeout: 1 });
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'extend me' }));
    const [first] = await receive(q.url);
    await sqs.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: q.url,
        ReceiptHandle: first?.ReceiptHandle,
        VisibilityTimeout: 30,
      }),
    );
    await sleep(2500); // well past the queue's 1 s
    expect(await receive(q.url)).toEqual([]);
    await sqs.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: q.url,
        ReceiptHandle: first?.ReceiptHandle,
        VisibilityTimeout: 0,
      }),
    );
    const [second] = await receive(q.url);
    expect(second?.MessageId).toBe(first?.MessageId);
    expect(receiveCount(second)).toBe(2);
  });

  test('ChangeMessageVisibilityBatch extends several at once (the heartbeat of a batch)', async () => {
    const q = await queue({ visibilityTimeout: 1 });
    for (const body of ['a', 'b', 'c'])
      await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: body }));
    const got = await receiveAll(q.url, 3);
    expect(got).toHaveLength(3);
    const { Successful, Failed } = await sqs.send(
      new ChangeMessageVisibilityBatchCommand({
        QueueUrl: q.url,
        Entries: got.map((m, i) => ({
          Id: String(i),
          ReceiptHandle: m.ReceiptHandle,
          VisibilityTimeout: 30,
        })),
      }),
    );
    expect(Successful).toHaveLength(3);
    expect(Failed ?? []).toEqual([]);
    await sleep(2500);
    expect(await receive(q.url, { MaxNumberOfMessages: 10 })).toEqual([]);
  });

  test('visibility is bounded: more than 12 hours is refused', async () => {
    const q = await queue();
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'x' }));
    const [m] = await receive(q.url);
    await expect(
      sqs.send(
        new ChangeMessageVisibilityCommand({
          QueueUrl: q.url,
          ReceiptHandle: m?.ReceiptHandle,
          VisibilityTimeout: 43_201,
        }),
      ),
    ).rejects.toMatchObject({ name: INVALID_PARAMETER });
    await sqs.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: q.url,
        ReceiptHandle: m?.ReceiptHandle,
        VisibilityTimeout: 43_200,
      }),
    );
  });

  test('an old receipt handle after redelivery: DeleteMessage succeeds but deletes nothing (fauxqs)', async () => {
    // SQS documents this outcome ("the request succeeds, but the message will not be deleted") and in practice often
    // deletes anyway: code must work either way. fauxqs never deletes with an old handle, and refuses a visibility
    // change with one.
    const q = await queue({ visibilityTimeout: 1 });
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'stale' }));
    const [first] = await receive(q.url);
    const [second] = await receiveAll(q.url, 1);
    expect(second?.MessageId).toBe(first?.MessageId);
    await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: first?.ReceiptHandle }));
    await expect(
      sqs.send(
        new ChangeMessageVisibilityCommand({
          QueueUrl: q.url,
          ReceiptHandle: first?.ReceiptHandle,
          VisibilityTimeout: 5,
        }),
      ),
    ).rejects.toMatchObject({ name: 'MessageNotInflight' });
    // Not deleted: it comes back once the second receipt's visibility runs out.
    const [third] = await receiveAll(q.url, 1);
    expect(third?.MessageId).toBe(first?.MessageId);
    expect(receiveCount(third)).toBe(3);
    // The current handle deletes it; deleting again with it is no error either.
    await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: third?.ReceiptHandle }));
    await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: third?.ReceiptHandle }));
    await sleep(1500);
    expect(await receive(q.url)).toEqual([]);
  });

  test('FIFO: a group is delivered in order, and blocked while one of its messages is in flight', async () => {
    const q = await queue({ fifo: true, visibilityTimeout: 1 });
    const send = (group: string, body: string) =>
      sqs.send(
        new SendMessageCommand({
          QueueUrl: q.url,
          MessageBody: body,
          MessageGroupId: group,
          MessageDeduplicationId: body,
        }),
      );
    for (const body of ['g1-1', 'g1-2', 'g1-3']) await send('g1', body);
    await send('g2', 'g2-1');
    const [first] = await receive(q.url, { MaxNumberOfMessages: 1 });
    expect(first?.Body).toBe('g1-1');
    expect(first?.Attributes?.MessageGroupId).toBe('g1');
    expect(first?.Attributes?.SequenceNumber).toMatch(/^\d+$/);
    // g1 is blocked while g1-1 is in flight; g2 is not.
    expect((await receive(q.url, { MaxNumberOfMessages: 10 })).map((m) => m.Body)).toEqual(['g2-1']);
    expect(await receive(q.url, { MaxNumberOfMessages: 10 })).toEqual([]);
    // g1-1 not deleted: once its visibility runs out it comes again, before g1-2 (order under failure).
    const [again] = await receiveAll(q.url, 1);
    expect(again?.Body).toBe('g1-1');
    expect(receiveCount(again)).toBe(2);
    await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: again?.ReceiptHandle }));
    const rest: string[] = [];
    while (rest.length < 2) {
      const [next] = await receiveAll(q.url, 1);
      if (next === undefined) break;
      rest.push(next.Body ?? '');
      await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: next.ReceiptHandle }));
    }
    expect(rest).toEqual(['g1-2', 'g1-3']);
  });

  test('FIFO (fauxqs): one ReceiveMessage returns at most one message per group', async () => {
    // SQS returns several messages of one group in one receive, in order ("as many messages with the same message
    // group ID as possible"); fauxqs returns the first of each group. A batch handler never sees two messages of
    // one group in one batch on fauxqs.
    const q = await queue({ fifo: true, contentBasedDeduplication: true });
    for (const body of ['a1', 'a2', 'a3', 'b1', 'b2']) {
      await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: body, MessageGroupId: body[0] }));
    }
    const batch = await receive(q.url, { MaxNumberOfMessages: 10 });
    expect(batch.map((m) => m.Body)).toEqual(['a1', 'b1']);
  });

  test('FIFO: a repeated MessageDeduplicationId is accepted and not delivered again, even after a delete', async () => {
    const q = await queue({ fifo: true });
    const send = (body: string, id: string) =>
      sqs.send(
        new SendMessageCommand({
          QueueUrl: q.url,
          MessageBody: body,
          MessageGroupId: 'g',
          MessageDeduplicationId: id,
        }),
      );
    const original = await send('first', 'order-1');
    const duplicate = await send('second, same id', 'order-1');
    // SQS answers a duplicate with the original's MessageId; so does fauxqs.
    expect(duplicate.MessageId).toBe(original.MessageId);
    const got = await receive(q.url, { MaxNumberOfMessages: 10 });
    expect(got.map((m) => m.Body)).toEqual(['first']);
    expect(got[0]?.Attributes?.MessageDeduplicationId).toBe('order-1');
    await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: got[0]?.ReceiptHandle }));
    await send('third, same id, after the delete', 'order-1');
    await send('another id', 'order-2');
    expect((await receiveAll(q.url, 2, 3000)).map((m) => m.Body)).toEqual(['another id']);
  });

  test('FIFO content-based deduplication: the same body twice is delivered once, another body is not held back', async () => {
    const q = await queue({ fifo: true, contentBasedDeduplication: true });
    const send = (body: string) =>
      sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: body, MessageGroupId: 'g' }));
    await send('{"order":1}');
    await send('{"order":1}');
    await send('{"order":2}');
    const got: Message[] = [];
    for (let i = 0; i < 3; i++) {
      const [m] = await receiveAll(q.url, 1, 2000);
      if (m === undefined) break;
      got.push(m);
      await sqs.send(new DeleteMessageCommand({ QueueUrl: q.url, ReceiptHandle: m.ReceiptHandle }));
    }
    expect(got.map((m) => m.Body)).toEqual(['{"order":1}', '{"order":2}']);
    // The deduplication id is the body's SHA-256, as SQS documents.
    expect(got[0]?.Attributes?.MessageDeduplicationId).toBe(
      createHash('sha256').update('{"order":1}').digest('hex'),
    );
  });

  test('a FIFO send without a deduplication id, on a queue without content-based deduplication, is refused', async () => {
    const q = await queue({ fifo: true });
    await expect(
      sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'x', MessageGroupId: 'g' })),
    ).rejects.toMatchObject({ name: INVALID_PARAMETER });
  });

  test('redrive: after maxReceiveCount receives, the next receive moves the message to the dead-letter queue', async () => {
    const q = await queue({ visibilityTimeout: 1, deadLetter: { maxReceiveCount: 2 } });
    await sqs.send(
      new SendMessageCommand({
        QueueUrl: q.url,
        MessageBody: 'poison',
        MessageAttributes: { kind: { DataType: 'String', StringValue: 'poison' } },
      }),
    );
    const [first] = await receive(q.url);
    const [second] = await receiveAll(q.url, 1);
    expect(receiveCount(first)).toBe(1);
    expect(receiveCount(second)).toBe(2);
    await sleep(1500);
    expect(await receive(q.url, { WaitTimeSeconds: 1 })).toEqual([]);
    const dead = await receiveAll(q.deadLetter?.url ?? '', 1);
    expect(dead.map((m) => [m.MessageId, m.Body])).toEqual([[first?.MessageId, 'poison']]);
    expect(dead[0]?.MessageAttributes?.kind?.StringValue).toBe('poison');
    // fauxqs carries the receive count over into the dead-letter queue (2 there, 3 on this receive).
    expect(receiveCount(dead[0])).toBe(4);
  });

  test('redrive on FIFO: the group moves on once its failing message is dead-lettered', async () => {
    const q = await queue({
      fifo: true,
      contentBasedDeduplication: true,
      visibilityTimeout: 1,
      deadLetter: { maxReceiveCount: 1 },
    });
    for (const body of ['bad', 'next']) {
      await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: body, MessageGroupId: 'g' }));
    }
    const [first] = await receive(q.url);
    expect(first?.Body).toBe('bad');
    const [after] = await receiveAll(q.url, 1);
    expect(after?.Body).toBe('next');
    const dead = await receiveAll(q.deadLetter?.url ?? '', 1);
    expect(dead.map((m) => [m.Body, m.Attributes?.MessageGroupId])).toEqual([['bad', 'g']]);
  });

  test('message attributes round trip (String, Number, Binary, custom types), checked by the SDK against their MD5', async () => {
    const q = await queue();
    const attributes: Record<string, MessageAttributeValue> = {
      idempotencyKey: { DataType: 'String', StringValue: 'order-42' },
      attempt: { DataType: 'Number', StringValue: '3' },
      blob: { DataType: 'Binary', BinaryValue: new Uint8Array([0, 1, 2, 254, 255]) },
      tenant: { DataType: 'String.tenant', StringValue: 'émile ☃' },
    };
    const sent = await sqs.send(
      new SendMessageCommand({
        QueueUrl: q.url,
        MessageBody: 'with attributes',
        MessageAttributes: attributes,
      }),
    );
    expect(sent.MD5OfMessageAttributes).toMatch(/^[0-9a-f]{32}$/);
    const [m] = await receive(q.url);
    expect(m?.MD5OfMessageAttributes).toBe(sent.MD5OfMessageAttributes);
    expect(m?.MessageAttributes?.idempotencyKey).toEqual(attributes.idempotencyKey);
    expect(m?.MessageAttributes?.attempt).toEqual(attributes.attempt);
    expect(m?.MessageAttributes?.tenant).toEqual(attributes.tenant);
    expect(m?.MessageAttributes?.blob?.DataType).toBe('Binary');
    expect([...(m?.MessageAttributes?.blob?.BinaryValue ?? [])]).toEqual([0, 1, 2, 254, 255]);
    // Only the names asked for.
    await sqs.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: q.url,
        ReceiptHandle: m?.ReceiptHandle,
        VisibilityTimeout: 0,
      }),
    );
    const [named] = await receive(q.url, { MessageAttributeNames: ['idempotencyKey'] });
    expect(Object.keys(named?.MessageAttributes ?? {})).toEqual(['idempotencyKey']);
  });

  test('batches: up to 10 per receive (11 is refused), and DeleteMessageBatch deletes them', async () => {
    const q = await queue({ visibilityTimeout: 30 });
    for (const offset of [0, 10]) {
      const entries = Array.from({ length: offset === 0 ? 10 : 5 }, (_, i) => ({
        Id: String(i),
        MessageBody: `m${offset + i}`,
      }));
      const { Successful } = await sqs.send(
        new SendMessageBatchCommand({ QueueUrl: q.url, Entries: entries }),
      );
      expect(Successful).toHaveLength(entries.length);
    }
    await expect(receive(q.url, { MaxNumberOfMessages: 11 })).rejects.toMatchObject({
      name: INVALID_PARAMETER,
    });
    const first = await receive(q.url, { MaxNumberOfMessages: 10 });
    // fauxqs fills the batch whenever it has 10 ready; SQS may return fewer (it samples servers).
    expect(first).toHaveLength(10);
    const rest = await receiveAll(q.url, 5);
    const all = [...first, ...rest];
    expect(new Set(all.map((m) => m.Body)).size).toBe(15);
    const { Successful, Failed } = await sqs.send(
      new DeleteMessageBatchCommand({
        QueueUrl: q.url,
        Entries: first.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle })),
      }),
    );
    expect(Successful).toHaveLength(10);
    expect(Failed ?? []).toEqual([]);
    const { Attributes } = await sqs.send(
      new GetQueueAttributesCommand({
        QueueUrl: q.url,
        AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible'],
      }),
    );
    expect(Attributes).toEqual({
      ApproximateNumberOfMessages: '0',
      ApproximateNumberOfMessagesNotVisible: '5',
    });
  });

  test('a long poll returns as soon as a message is sent', async () => {
    const q = await queue();
    const started = Date.now();
    const polling = receive(q.url, { WaitTimeSeconds: 20 });
    await sleep(300);
    await sqs.send(new SendMessageCommand({ QueueUrl: q.url, MessageBody: 'wake up' }));
    expect((await polling).map((m) => m.Body)).toEqual(['wake up']);
    expect(Date.now() - started).toBeLessThan(15_000); // generous: it would be 20 s if the poll ignored the send
  });
});
