/**
 * @services redis
 */
import { IdempotencyOptionsError, PermanentError } from '@oncely/core';
import type { DynamoDBRecord, KinesisStreamRecord, MSKRecord } from 'aws-lambda';
import { type BatchRecord, type BatchSettledEvent, idempotentBatch } from '../src';
import {
  dynamodbEvent,
  dynamodbRecord,
  kafkaRecord,
  kinesisEvent,
  kinesisRecord,
  lambdaContext,
  mskEvent,
  selfManagedKafkaEvent,
  sqsEvent,
  sqsRecord,
} from './batch-events';
import { dynamodbUnderTest, redisUnderTest, type StoreUnderTest } from './batch-stores';

// Kinesis, DynamoDB Streams and Kafka events through idempotentBatch, on the real Redis and on DynamoDB
// (dynalite): the shard or partition stops at its first failure, and what no retry can fix does not hold it.

const ids = (response: { batchItemFailures: Array<{ itemIdentifier: unknown }> }) =>
  response.batchItemFailures.map((f) => f.itemIdentifier);
const decoded = (data: string) => JSON.parse(Buffer.from(data, 'base64').toString('utf8')) as { id: string };

describe.each<[string, () => StoreUnderTest]>([
  ['redis', redisUnderTest],
  ['dynamodb', dynamodbUnderTest],
])('streams on %s', (_name, make) => {
  const under = make();
  beforeAll(() => under.start());
  afterAll(() => under.stop());

  describe('Kinesis', () => {
    test('the shard stops at its first failure: it and every later record are reported, none of them run', async () => {
      const fail = new Set(['r3']);
      const runs: string[] = [];
      const events: string[] = [];
      const handler = idempotentBatch(
        async (record: KinesisStreamRecord) => {
          const { id } = decoded(record.kinesis.data);
          runs.push(id);
          if (fail.has(id)) throw new Error(`cannot do ${id}`);
        },
        {
          store: under.store(),
          onSettled: (e) =>
            events.push(`${decoded(e.message.kinesis.data).id} ${e.action}:${e.reason} ${e.reported}`),
        },
      );
      const records = ['r1', 'r2', 'r3', 'r4', 'r5'].map((id) => kinesisRecord({ id }));
      const seq = (i: number) => records[i]?.kinesis.sequenceNumber;
      const first = await handler(kinesisEvent(records), lambdaContext());
      expect(ids(first)).toEqual([seq(2), seq(3), seq(4)]);
      expect(runs).toEqual(['r1', 'r2', 'r3']);
      // Every record has its event, the ones stopped behind r3 included.
      expect(events).toEqual([
        'r1 ack:executed false',
        'r2 ack:executed false',
        'r3 retry:failed true',
        'r4 delay:group-stopped true',
        'r5 delay:group-stopped true',
      ]);
      events.length = 0;

      // Lambda checkpoints before r3 and delivers r3.. again (some retries send the whole batch: r1, r2 replay).
      fail.clear();
      const again = await handler(kinesisEvent(records), lambdaContext());
      expect(ids(again)).toEqual([]);
      expect(runs).toEqual(['r1', 'r2', 'r3', 'r3', 'r4', 'r5']);
    });

    test('a permanent failure does not hold the shard: it is skipped (logged), the rest runs', async () => {
      const runs: string[] = [];
      const settled: BatchSettledEvent<KinesisStreamRecord>[] = [];
      const errors: unknown[] = [];
      const logger = {
        error: (fields: unknown) => errors.push(fields),
        warn: () => {},
        info: () => {},
        debug: () => {},
      };
      const handler = idempotentBatch(
        async (record: KinesisStreamRecord) => {
          const { id } = decoded(record.kinesis.data);
          runs.push(id);
          if (id === 'poison') throw new PermanentError('cannot ever parse this');
        },
        { store: under.store(), onSettled: (e) => settled.push(e), logger },
      );
      const records = ['ok-1', 'poison', 'ok-2'].map((id) => kinesisRecord({ id }));
      expect(ids(await handler(kinesisEvent(records), lambdaContext()))).toEqual([]);
      expect(runs).toEqual(['ok-1', 'poison', 'ok-2']);
      expect(settled.map((e) => [e.action, e.reason, e.reported])).toEqual([
        ['ack', 'executed', false],
        ['dead-letter', 'permanent', false],
        ['ack', 'executed', false],
      ]);
      expect(errors).toEqual([
        expect.objectContaining({ reason: 'permanent', item: records[1]?.kinesis.sequenceNumber }),
      ]);
    });

    test('with onDeadLetter, the record is handed over first; if that fails, the shard stops there', async () => {
      const letters: string[] = [];
      let broken = true;
      const handler = idempotentBatch(
        async (record: KinesisStreamRecord) => {
          if (decoded(record.kinesis.data).id === 'poison') throw new PermanentError('never');
        },
        {
          store: under.store(),
          onDeadLetter: async (record, { reason }) => {
            if (broken) throw new Error('the dead-letter stream is unreachable');
            letters.push(`${decoded(record.kinesis.data).id}:${reason}`);
          },
        },
      );
      const records = ['a', 'poison', 'b'].map((id) => kinesisRecord({ id }));
      const seq = (i: number) => records[i]?.kinesis.sequenceNumber;
      expect(ids(await handler(kinesisEvent(records), lambdaContext()))).toEqual([seq(1), seq(2)]);
      broken = false;
      expect(ids(await handler(kinesisEvent(records.slice(1)), lambdaContext()))).toEqual([]);
      // The stored permanent failure is handed over again without running the handler.
      expect(letters).toEqual(['poison:permanent']);
    });

    test('the default key is the stream, shard and sequence number: one record delivered twice runs once', async () => {
      const keys: Array<string | undefined> = [];
      const handler = idempotentBatch(async () => {}, {
        store: under.store(),
        onSettled: (e) => keys.push(e.key),
      });
      const record = kinesisRecord({ id: 'x' });
      await handler(kinesisEvent([record]), lambdaContext());
      await handler(kinesisEvent([record]), lambdaContext());
      expect(keys).toEqual([`lambda-stream/${record.eventID}`, `lambda-stream/${record.eventID}`]);
    });

    test('{ bodyField } keys on a field of the decoded data: two records of one order run once', async () => {
      let runs = 0;
      const handler = idempotentBatch(
        async () => {
          runs++;
        },
        { store: under.store(), key: { bodyField: 'orderId' } },
      );
      const records = [kinesisRecord({ orderId: 'o-1' }), kinesisRecord({ orderId: 'o-1' })];
      expect(ids(await handler(kinesisEvent(records), lambdaContext()))).toEqual([]);
      expect(runs).toBe(1);
    });
  });

  describe('DynamoDB Streams', () => {
    test('the shard stops at its first failure; identifiers are dynamodb.SequenceNumber; a retry runs the rest', async () => {
      const fail = new Set(['2']);
      const runs: string[] = [];
      const handler = idempotentBatch(
        async (record: DynamoDBRecord) => {
          const id = record.dynamodb?.Keys?.Id?.N as string;
          runs.push(id);
          if (fail.has(id)) throw new Error('downstream unavailable');
        },
        { store: under.store() },
      );
      const records = ['1', '2', '3'].map((id) => dynamodbRecord(id, `hello ${id}`));
      const first = await handler(dynamodbEvent(records), lambdaContext());
      expect(ids(first)).toEqual([
        records[1]?.dynamodb?.SequenceNumber,
        records[2]?.dynamodb?.SequenceNumber,
      ]);
      expect(runs).toEqual(['1', '2']);
      fail.clear();
      expect(ids(await handler(dynamodbEvent(records.slice(1)), lambdaContext()))).toEqual([]);
      expect(ids(await handler(dynamodbEvent(records), lambdaContext()))).toEqual([]);
      expect(runs).toEqual(['1', '2', '2', '3']);
    });

    test('the default key is eventID; { bodyField } reads the new image', async () => {
      const keys: Array<string | undefined> = [];
      const record = dynamodbRecord('7', 'seven');
      await idempotentBatch(async () => {}, { store: under.store(), onSettled: (e) => keys.push(e.key) })(
        dynamodbEvent([record]),
        lambdaContext(),
      );
      await idempotentBatch(async () => {}, {
        store: under.store(),
        key: { bodyField: 'Message' },
        onSettled: (e) => keys.push(e.key),
      })(dynamodbEvent([record]), lambdaContext());
      expect(keys).toEqual([record.eventID, 'seven']);
    });
  });

  describe('Kafka', () => {
    test('each partition stops at its first failure; identifiers are { partition, offset }; others go on', async () => {
      const fail = new Set(['p0-2']);
      const runs: string[] = [];
      const handler = idempotentBatch(
        async (record: MSKRecord) => {
          const { id } = decoded(record.value);
          runs.push(id);
          if (fail.has(id)) throw new Error('no');
        },
        { store: under.store() },
      );
      const p0 = [1, 2, 3, 4].map((o) => kafkaRecord('orders', 0, o, { id: `p0-${o}` }));
      const p1 = [10, 11].map((o) => kafkaRecord('orders', 1, o, { id: `p1-${o}` }));
      const response = await handler(mskEvent([...p0, ...p1]), lambdaContext());
      expect(ids(response)).toEqual([
        { partition: 'orders-0', offset: 2 },
        { partition: 'orders-0', offset: 3 },
        { partition: 'orders-0', offset: 4 },
      ]);
      expect([...runs].sort()).toEqual(['p0-1', 'p0-2', 'p1-10', 'p1-11']);
      fail.clear();
      expect(ids(await handler(selfManagedKafkaEvent(p0), lambdaContext()))).toEqual([]);
      expect(runs.filter((r) => r.startsWith('p0')).sort()).toEqual(['p0-1', 'p0-2', 'p0-2', 'p0-3', 'p0-4']);
    });

    test('the default key is topic, partition and offset; { attribute } reads a header', async () => {
      const keys: Array<string | undefined> = [];
      const record = kafkaRecord('orders', 3, 42, { id: 'x' }, { 'Idempotency-Key': 'order-42' });
      await idempotentBatch(async () => {}, { store: under.store(), onSettled: (e) => keys.push(e.key) })(
        mskEvent([record]),
        lambdaContext(),
      );
      await idempotentBatch(async () => {}, {
        store: under.store(),
        key: { attribute: 'Idempotency-Key' },
        onSettled: (e) => keys.push(e.key),
      })(mskEvent([record]), lambdaContext());
      expect(keys).toEqual(['orders-3@42', 'order-42']);
    });
  });
});

describe('events and options', () => {
  const handler = idempotentBatch(async () => {});

  test('an event that is no batch fails the invocation with a clear error (no record can be answered)', async () => {
    await expect(handler({ httpMethod: 'POST' } as never, lambdaContext())).rejects.toThrow(
      /SQS, Kinesis, DynamoDB Streams and Kafka events/,
    );
    await expect(handler({ Records: [{ eventSource: 'aws:s3' }] } as never, lambdaContext())).rejects.toThrow(
      /"aws:s3"/,
    );
    await expect(
      handler({ Records: [{ eventSource: 'aws:kinesis', kinesis: {} }] } as never, lambdaContext()),
    ).rejects.toThrow(/no kinesis.sequenceNumber/);
  });

  test('an empty batch is answered with no failures', async () => {
    expect(await handler(sqsEvent([]), lambdaContext())).toEqual({ batchItemFailures: [] });
  });

  test.each<[string, Record<string, unknown>]>([
    ['retryDelay', { retryDelay: '1s' }],
    ['inProgressDelay', { inProgressDelay: '1s' }],
    ['concurrency', { concurrency: 0 }],
    ['onDeadLetter', { onDeadLetter: 'dlq' }],
    ['onSettled', { onSettled: 'log' }],
    ['leaseMargin', { leaseMargin: 'a second' }],
    ['partialBatchResponse', { partialBatchResponse: 'yes' }],
    ['key', { key: { header: 'x' } }],
    ['fingerprint', { fingerprint: 'body' }],
    ['nope', { nope: true }],
  ])('a bad %s is refused at construction, naming the option', (option, options) => {
    const make = () => idempotentBatch(async (_r: BatchRecord) => {}, options as never);
    expect(make).toThrow(IdempotencyOptionsError);
    expect(make).toThrow(expect.objectContaining({ option }));
  });

  test('the handler must be a function', () => {
    expect(() => idempotentBatch('handler' as never)).toThrow(
      expect.objectContaining({ option: 'recordHandler' }),
    );
  });

  test('a record handler that throws for one record does not make the invocation throw', async () => {
    const records = [sqsRecord({ body: 'a' }), sqsRecord({ body: 'b' })];
    const failing = idempotentBatch(async () => {
      throw new TypeError('bug');
    });
    const response = await failing(sqsEvent(records), lambdaContext());
    expect(ids(response)).toEqual(records.map((r) => r.messageId));
  });
});
