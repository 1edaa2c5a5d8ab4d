/**
 * @services redis
 */
import { currentIdempotency, type Duration, type IdempotencyStore, PermanentError } from '@oncely/core';
import type { SQSRecord } from 'aws-lambda';
import { type BatchSettledEvent, idempotentBatch } from '../src';
import { lambdaContext, redelivered, sqsEvent, sqsRecord } from './batch-events';
import { dynamodbUnderTest, redisUnderTest, type StoreUnderTest } from './batch-stores';

// SQS events (standard and FIFO) through idempotentBatch, on the real Redis and on DynamoDB (dynalite): what is
// reported, what runs, and how often.

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const ids = (response: { batchItemFailures: Array<{ itemIdentifier: unknown }> }) =>
  response.batchItemFailures.map((f) => f.itemIdentifier);

describe.each<[string, () => StoreUnderTest]>([
  ['redis', redisUnderTest],
  ['dynamodb', dynamodbUnderTest],
])('SQS batches on %s', (_name, make) => {
  const under = make();
  beforeAll(() => under.start());
  afterAll(() => under.stop());

  /** A handler counting executions per body, failing the bodies in `fail`. */
  function counting(store: IdempotencyStore, fail: Set<string> = new Set()) {
    const runs = new Map<string, number>();
    const settled: BatchSettledEvent<SQSRecord>[] = [];
    const handler = idempotentBatch(
      async (record: SQSRecord) => {
        runs.set(record.body, (runs.get(record.body) ?? 0) + 1);
        await sleep(5);
        if (fail.has(record.body)) throw new Error(`cannot do ${record.body}`);
      },
      { store, onSettled: (event) => settled.push(event) },
    );
    return { handler, runs, settled };
  }

  test('a failed record is reported and the others are not; the retry runs only the failed one', async () => {
    const fail = new Set(['b']);
    const { handler, runs } = counting(under.store(), fail);
    const records = ['a', 'b', 'c', 'd'].map((body) => sqsRecord({ body }));
    const first = await handler(sqsEvent(records), lambdaContext());
    expect(ids(first)).toEqual([records[1]?.messageId]);
    expect(Object.fromEntries(runs)).toEqual({ a: 1, b: 1, c: 1, d: 1 });

    // Lambda deletes a, c and d; b comes back, and now succeeds.
    fail.clear();
    const second = await handler(sqsEvent([redelivered(records[1] as SQSRecord)]), lambdaContext());
    expect(ids(second)).toEqual([]);
    expect(runs.get('b')).toBe(2);
  });

  test('a whole batch delivered again (no partial response, or a timeout) runs nothing twice', async () => {
    const { handler, runs, settled } = counting(under.store());
    const records = Array.from({ length: 10 }, (_, i) => sqsRecord({ body: `m${i}` }));
    expect(ids(await handler(sqsEvent(records), lambdaContext()))).toEqual([]);
    expect(ids(await handler(sqsEvent(records.map(redelivered)), lambdaContext()))).toEqual([]);
    expect([...runs.values()]).toEqual(Array(10).fill(1));
    expect(settled.filter((e) => e.reason === 'replayed')).toHaveLength(10);
    expect(settled.every((e) => !e.reported)).toBe(true);
  });

  test('duplicates inside one batch (one key, several sends) run once, and none is reported', async () => {
    const { handler, runs } = counting(under.store());
    // Five sends of one order (five message ids, one Idempotency-Key), among other orders.
    const records = [
      ...Array.from({ length: 5 }, () => sqsRecord({ body: 'order-1', key: 'order-1' })),
      sqsRecord({ body: 'order-2', key: 'order-2' }),
      sqsRecord({ body: 'order-3', key: 'order-3' }),
    ];
    const response = await handler(sqsEvent(records), lambdaContext());
    expect(ids(response)).toEqual([]);
    expect(Object.fromEntries(runs)).toEqual({ 'order-1': 1, 'order-2': 1, 'order-3': 1 });
  });

  test('duplicates across batches and concurrent invocations: one execution per key', async () => {
    const store = under.store();
    const { handler, runs } = counting(store);
    const keys = Array.from({ length: 20 }, (_, i) => `k${i}`);
    // Eight invocations at once, each with every key (sent again: new message ids).
    const batches = Array.from({ length: 8 }, () => keys.map((key) => sqsRecord({ body: key, key })));
    const responses = await Promise.all(batches.map((b) => handler(sqsEvent(b), lambdaContext())));
    for (const key of keys) expect(runs.get(key)).toBe(1);
    // A record whose key another invocation was still running is reported; delivered again, it is a duplicate.
    const reported = new Set(responses.flatMap(ids));
    const again = batches.flat().filter((r) => reported.has(r.messageId));
    const last = await handler(sqsEvent(again.map(redelivered)), lambdaContext());
    expect(ids(last)).toEqual([]);
    for (const key of keys) expect(runs.get(key)).toBe(1);
    // dynalite under the load of a shared machine: generous.
  }, 120_000);

  test('a record whose key is held by a running invocation is reported, not run', async () => {
    const store = under.store();
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let runs = 0;
    const slow = idempotentBatch(
      async () => {
        runs++;
        await gate;
      },
      { store },
    );
    const record = sqsRecord({ body: 'held', key: 'held' });
    const first = slow(sqsEvent([record]), lambdaContext());
    await waitFor(() => runs === 1);
    const other = sqsRecord({ body: 'held', key: 'held' });
    expect(ids(await slow(sqsEvent([other]), lambdaContext()))).toEqual([other.messageId]);
    release();
    expect(ids(await first)).toEqual([]);
    expect(ids(await slow(sqsEvent([redelivered(other)]), lambdaContext()))).toEqual([]);
    expect(runs).toBe(1);
  });

  /** A handler whose first run of a body hangs until released; counts runs. */
  function hanging(options: { lockTimeout?: Duration } = {}) {
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let runs = 0;
    const handler = idempotentBatch(
      async (_record: SQSRecord) => {
        if (++runs === 1) await gate;
      },
      { store: under.store(), ...options },
    );
    return { handler, release, runs: () => runs };
  }

  test('the lease ends with the invocation: a delivery after its deadline takes the key over', async () => {
    const { handler, release, runs } = hanging();
    const record = sqsRecord({ body: 'late', key: 'late' });
    // An invocation with 50 ms left, whose record outlives it (Lambda would have stopped it).
    const first = handler(sqsEvent([record]), lambdaContext(50));
    await waitFor(() => runs() === 1);
    let answer = await handler(sqsEvent([redelivered(record)]), lambdaContext());
    const deadline = Date.now() + 15_000;
    while (answer.batchItemFailures.length > 0 && Date.now() < deadline) {
      await sleep(100);
      answer = await handler(sqsEvent([redelivered(record)]), lambdaContext());
    }
    expect(ids(answer)).toEqual([]);
    expect(runs()).toBe(2);
    release();
    await first;
  });

  test('an explicit lockTimeout sets the lease instead of the deadline', async () => {
    const { handler, release, runs } = hanging({ lockTimeout: '30s' });
    const record = sqsRecord({ body: 'held', key: 'held-long' });
    const first = handler(sqsEvent([record]), lambdaContext(50));
    await waitFor(() => runs() === 1);
    // Well past the invocation's deadline and the shortest lease a deadline gives (1 s).
    await sleep(2500);
    const other = redelivered(record);
    expect(ids(await handler(sqsEvent([other]), lambdaContext()))).toEqual([other.messageId]);
    expect(runs()).toBe(1);
    release();
    expect(ids(await first)).toEqual([]);
  });

  test('FIFO: a group stops at its first failure and reports the rest of it; other groups go on', async () => {
    const fail = new Set(['a2']);
    const { handler, runs } = counting(under.store(), fail);
    const a = ['a1', 'a2', 'a3', 'a4'].map((body) =>
      sqsRecord({ body, groupId: 'A', deduplicationId: body }),
    );
    const b = ['b1', 'b2', 'b3'].map((body) => sqsRecord({ body, groupId: 'B', deduplicationId: body }));
    // Interleaved, as SQS may deliver several groups in one batch.
    const records = [a[0], b[0], a[1], b[1], a[2], b[2], a[3]] as SQSRecord[];
    const response = await handler(sqsEvent(records), lambdaContext());
    expect(ids(response)).toEqual([a[1]?.messageId, a[2]?.messageId, a[3]?.messageId]);
    expect(Object.fromEntries(runs)).toEqual({ a1: 1, a2: 1, b1: 1, b2: 1, b3: 1 });

    // The group comes back in order from its failed message, and now succeeds.
    fail.clear();
    const again = await handler(
      sqsEvent([a[1], a[2], a[3]].map((r) => redelivered(r as SQSRecord))),
      lambdaContext(),
    );
    expect(ids(again)).toEqual([]);
    expect(Object.fromEntries(runs)).toEqual({ a1: 1, a2: 2, a3: 1, a4: 1, b1: 1, b2: 1, b3: 1 });
  });

  test('FIFO: one deduplication id in two groups is two messages, each run once', async () => {
    // A high-throughput FIFO queue deduplicates per message group: the same id in groups A and B is two messages.
    const { handler, runs } = counting(under.store());
    const records = [
      sqsRecord({ body: 'tenant A', groupId: 'A', deduplicationId: 'order-1' }),
      sqsRecord({ body: 'tenant B', groupId: 'B', deduplicationId: 'order-1' }),
    ];
    expect(ids(await handler(sqsEvent(records), lambdaContext()))).toEqual([]);
    expect(Object.fromEntries(runs)).toEqual({ 'tenant A': 1, 'tenant B': 1 });
    // Within a group, the id still deduplicates a producer's resend under a new messageId.
    const resend = sqsRecord({ body: 'tenant A', groupId: 'A', deduplicationId: 'order-1' });
    expect(ids(await handler(sqsEvent([resend]), lambdaContext()))).toEqual([]);
    expect(runs.get('tenant A')).toBe(1);
  });

  test('FIFO: the records of a group run one after another, in order', async () => {
    const order: string[] = [];
    let running = 0;
    let overlapped = false;
    const handler = idempotentBatch(
      async (record: SQSRecord) => {
        running++;
        if (running > 1) overlapped = true;
        await sleep(10);
        order.push(record.body);
        running--;
      },
      { store: under.store() },
    );
    const records = ['1', '2', '3', '4', '5'].map((body) =>
      sqsRecord({ body, groupId: 'G', deduplicationId: body }),
    );
    expect(ids(await handler(sqsEvent(records), lambdaContext()))).toEqual([]);
    expect(order).toEqual(['1', '2', '3', '4', '5']);
    expect(overlapped).toBe(false);
  });

  test('standard queue: records run concurrently, at most `concurrency` at once', async () => {
    let running = 0;
    let started = 0;
    let most = 0;
    const handler = idempotentBatch(
      async () => {
        running++;
        started++;
        most = Math.max(most, running);
        // Each waits for a full set of three (however slow the store is), or for the last records to have started
        // (slots free one by one, so the last two may find no third), then holds its slot a little longer: an
        // unbounded handler would let all twelve in.
        await waitFor(() => running >= 3 || started === records.length);
        await sleep(30);
        running--;
      },
      { store: under.store(), concurrency: 3 },
    );
    const records = Array.from({ length: 12 }, (_, i) => sqsRecord({ body: `c${i}` }));
    expect(ids(await handler(sqsEvent(records), lambdaContext()))).toEqual([]);
    expect(most).toBe(3);
  });

  test('a permanent failure is reported for the redrive policy, and never run again', async () => {
    let runs = 0;
    const settled: BatchSettledEvent<SQSRecord>[] = [];
    const handler = idempotentBatch(
      async (_record: SQSRecord) => {
        runs++;
        throw new PermanentError('the card was refused');
      },
      { store: under.store(), onSettled: (e) => settled.push(e) },
    );
    const record = sqsRecord({ body: 'refused', key: 'refused' });
    expect(ids(await handler(sqsEvent([record]), lambdaContext()))).toEqual([record.messageId]);
    expect(ids(await handler(sqsEvent([redelivered(record)]), lambdaContext()))).toEqual([record.messageId]);
    expect(runs).toBe(1);
    expect(settled.map((e) => [e.action, e.reason, e.reported])).toEqual([
      ['dead-letter', 'permanent', true],
      ['dead-letter', 'permanent', true],
    ]);
  });

  test('onDeadLetter takes a record no retry can fix; if it fails, the record is reported', async () => {
    const letters: Array<[string, string]> = [];
    let broken = false;
    const handler = idempotentBatch(
      async (record: SQSRecord) => {
        if (record.body === 'bad') throw new PermanentError('bad order');
      },
      {
        store: under.store(),
        key: { bodyField: 'id' },
        onDeadLetter: async (record, { reason }) => {
          if (broken) throw new Error('dead-letter queue unreachable');
          letters.push([record.messageId, reason]);
        },
      },
    );
    const bad = sqsRecord({ body: 'bad' }); // not JSON: no key
    const fine = sqsRecord({ body: '{"id":"o-1"}' });
    expect(ids(await handler(sqsEvent([bad, fine]), lambdaContext()))).toEqual([]);
    expect(letters).toEqual([[bad.messageId, 'missing-key']]);
    broken = true;
    expect(ids(await handler(sqsEvent([redelivered(bad)]), lambdaContext()))).toEqual([bad.messageId]);
  });

  test('a key reused for another body is a mismatch: reported, not run', async () => {
    const { handler, runs } = counting(under.store());
    const first = sqsRecord({ body: 'pay 10', key: 'pay-1' });
    const other = sqsRecord({ body: 'pay 20', key: 'pay-1' });
    expect(ids(await handler(sqsEvent([first]), lambdaContext()))).toEqual([]);
    expect(ids(await handler(sqsEvent([other]), lambdaContext()))).toEqual([other.messageId]);
    expect(runs.get('pay 20')).toBeUndefined();
  });

  test('the record handler runs in an idempotency context: currentIdempotency() and steps', async () => {
    const seen: Array<string | undefined> = [];
    let charges = 0;
    let attempt = 0;
    const handler = idempotentBatch(
      async (record: SQSRecord) => {
        const context = currentIdempotency();
        seen.push(context?.key);
        await context?.step('charge', async () => {
          charges++;
        });
        if (++attempt === 1) throw new Error('crashed after the charge');
        return record.body;
      },
      { store: under.store() },
    );
    const record = sqsRecord({ body: 'x', key: 'order-9' });
    expect(ids(await handler(sqsEvent([record]), lambdaContext()))).toEqual([record.messageId]);
    expect(ids(await handler(sqsEvent([redelivered(record)]), lambdaContext()))).toEqual([]);
    expect(seen).toEqual(['order-9', 'order-9']);
    expect(charges).toBe(1);
  });

  test('partialBatchResponse: false throws when a record must come again; the retry replays the rest', async () => {
    const fail = new Set(['b']);
    const runs = new Map<string, number>();
    const handler = idempotentBatch(
      async (record: SQSRecord) => {
        runs.set(record.body, (runs.get(record.body) ?? 0) + 1);
        if (fail.has(record.body)) throw new Error('no');
      },
      { store: under.store(), partialBatchResponse: false },
    );
    const records = ['a', 'b', 'c'].map((body) => sqsRecord({ body }));
    await expect(handler(sqsEvent(records), lambdaContext())).rejects.toMatchObject({
      name: 'BatchRetryError',
      batchItemFailures: [{ itemIdentifier: records[1]?.messageId }],
    });
    fail.clear();
    expect(ids(await handler(sqsEvent(records.map(redelivered)), lambdaContext()))).toEqual([]);
    expect(Object.fromEntries(runs)).toEqual({ a: 1, b: 2, c: 1 });
  });
});

async function waitFor(check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await sleep(5);
  }
}
