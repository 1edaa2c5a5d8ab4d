// Event-source batches (SQS, Kinesis, DynamoDB Streams, Kafka): each record's work runs once per key on the consumer
// runtime of @oncely/core, and the records Lambda must deliver again come back as `batchItemFailures`.
import { type Duration, IdempotencyOptionsError } from '@oncely/core';
import {
  type ConsumerOptions,
  type ConsumerSettledEvent,
  type ConsumerSettlement,
  consumerRuntime,
  durationOption,
  type LeaseSettings,
} from '@oncely/core/adapter';
import { inGroupOrder, type SqsMessageView } from '@oncely/sqs/records';
import type {
  Context,
  DynamoDBRecord,
  DynamoDBStreamEvent,
  KinesisStreamEvent,
  KinesisStreamRecord,
  MSKEvent,
  SelfManagedKafkaEvent,
  SQSEvent,
  SQSRecord,
} from 'aws-lambda';
import {
  type BatchItemFailure,
  type BatchKeySource,
  type BatchRecord,
  batchOf,
  defaultFingerprint,
  failuresBefore,
  groupOf,
  type Item,
  type KafkaItemIdentifier,
  type KafkaRecord,
  keyFunction,
  type SourceKind,
} from './batch/sources';

export type { BatchItemFailure, BatchKeySource, BatchRecord, KafkaItemIdentifier, KafkaRecord };

/** The event whose records are `R`. */
export type BatchEventOf<R> = R extends SQSRecord
  ? SQSEvent
  : R extends KinesisStreamRecord
    ? KinesisStreamEvent
    : R extends DynamoDBRecord
      ? DynamoDBStreamEvent
      : R extends KafkaRecord
        ? MSKEvent | SelfManagedKafkaEvent
        : never;

/** The partial batch response's identifier of a record `R`: a string, or `{ partition, offset }` for Kafka. */
export type ItemIdentifierOf<R> = R extends KafkaRecord ? KafkaItemIdentifier : string;

/**
 * What the handler returns: the records Lambda must deliver again (`ReportBatchItemFailures`). `I` is the type of
 * their identifiers, so that an SQS, Kinesis or DynamoDB Streams handler is what @types/aws-lambda's handler types
 * expect.
 */
export interface BatchResponse<I extends string | KafkaItemIdentifier = string | KafkaItemIdentifier> {
  /** The records Lambda must deliver again; empty when every record is done. */
  batchItemFailures: Array<{
    /**
     * SQS: `messageId`; Kinesis: `kinesis.sequenceNumber`; DynamoDB Streams: `dynamodb.SequenceNumber`; Kafka:
     * `{ partition, offset }`.
     */
    itemIdentifier: I;
  }>;
}

/** Why a record was handed to `onDeadLetter`, and the error when there was one. */
export interface DeadLetter {
  /**
   * Why no retry can fix the record: `'permanent'` (a permanent failure), `'mismatch'` (its key was used for another
   * payload), `'invalid-key'`, `'missing-key'`, or `'retries-exhausted'`.
   */
  reason: Extract<ConsumerSettlement, { action: 'dead-letter' }>['reason'];
  /** The error the record failed with, when it failed with one. */
  error?: unknown;
}

/**
 * What `idempotentBatch` did with one record, for metrics and logs (`onSettled`). A record not run because an earlier
 * record of its FIFO group, shard or partition was not done is a `delay` with reason `group-stopped`, reported.
 */
export type BatchSettledEvent<R> = (
  | ConsumerSettledEvent<R>
  | (Omit<ConsumerSettledEvent<R>, 'action' | 'reason'> & {
      /** The record was not run; Lambda delivers it again. */
      action: 'delay';
      /** An earlier record of its FIFO group, shard or partition was not done. */
      reason: 'group-stopped';
    })
) & {
  /** Whether the record is in `batchItemFailures` (Lambda delivers it again). */
  reported: boolean;
};

/**
 * The shared consumer options (docs/consumers.md) except the delays, which Lambda decides (the queue's visibility
 * timeout, the stream's retries), and the batch's own.
 */
export interface BatchOptions<R extends BatchRecord = BatchRecord>
  extends Omit<ConsumerOptions<R>, 'retryDelay' | 'inProgressDelay' | 'onSettled'> {
  /**
   * Where a record's key comes from. Default: SQS: the `Idempotency-Key` message attribute, else
   * `MessageDeduplicationId` within its message group (FIFO), else `messageId`; Kinesis: `<stream name>/<eventID>`; DynamoDB Streams:
   * `eventID`; Kafka: `<topic>-<partition>@<offset>`. The defaults recognise Lambda delivering a record again, not
   * a producer sending the same thing twice: for that, key on what the producer sets.
   */
  key?: BatchKeySource<R>;
  /** Records of a standard queue (or of different FIFO groups, Kafka partitions) run at once, at most this many. Default: `10`. */
  concurrency?: number;
  /**
   * Takes a record no retry can fix (a permanent failure, a key reused for another payload, no key, retries used
   * up): once it resolves, the record counts as done and is not reported. What it throws is logged, and the record
   * is reported. Without it, SQS records are reported (the queue's redrive policy moves them to its dead-letter
   * queue after `maxReceiveCount` receives), and stream and Kafka records are logged and skipped, so that one bad
   * record does not hold its shard or partition until it expires. Default: none.
   */
  onDeadLetter?: (record: R, deadLetter: DeadLetter) => unknown;
  /**
   * `true`: return `{ batchItemFailures }` (the event source mapping has `ReportBatchItemFailures`). `false`: throw
   * when any record must come again, so that Lambda retries the whole batch and the records already done are
   * recognised as duplicates: for a mapping without partial batch responses (a Kafka mapping in on-demand mode).
   * Default: `true`.
   */
  partialBatchResponse?: boolean;
  /**
   * How long past the invocation's deadline (`context.getRemainingTimeInMillis()`) a record's lease may run, when
   * `lockTimeout` is not set: the delivery after a timeout takes the key over once it has passed. Default: `'1s'`.
   */
  leaseMargin?: Duration;
  /** Called after each record is settled. Exceptions are logged and ignored. */
  onSettled?: (event: BatchSettledEvent<R>) => void;
}

/** Thrown by a handler with `partialBatchResponse: false` when records must be delivered again. */
export class BatchRetryError extends Error {
  /** The records to deliver again, as a partial batch response would have listed them. */
  readonly batchItemFailures: BatchItemFailure[];
  /** Made by the handler: `batchItemFailures` of the event's `total` records must be delivered again. */
  constructor(batchItemFailures: BatchItemFailure[], total: number) {
    super(
      `oncely: ${batchItemFailures.length} of ${total} records must be delivered again; failing the batch so that Lambda retries it (the records already done are duplicates then).`,
    );
    this.name = 'BatchRetryError';
    this.batchItemFailures = batchItemFailures;
  }
}

/** How long past the invocation's deadline a lease may run, by default: clocks of Lambda and the store differ. */
const DEFAULT_MARGIN_MS = 1000;
const DEFAULT_CONCURRENCY = 10;

/**
 * Returns a Lambda handler for SQS (standard and FIFO), Kinesis, DynamoDB Streams and Kafka (Amazon MSK and
 * self-managed) events that runs `recordHandler` at most once per record key across every invocation sharing
 * `options.store`, and answers with the records Lambda must deliver again:
 *
 * - done now, or done before (a duplicate): not reported;
 * - the key is held by another invocation still working on it, the store is unreachable, or the work failed:
 *   reported (Lambda delivers it again);
 * - no retry can fix it (permanent failure, key reused for another payload, no key): see `onDeadLetter`.
 *
 * On a FIFO queue a message group, on Kinesis and DynamoDB Streams the shard, on Kafka a partition, stops at its
 * first reported record, and every later record of it is reported unprocessed, as Lambda needs to keep their order.
 * Records of a standard queue run concurrently (`concurrency`). The lease of a running record never runs past the
 * invocation's deadline (`context.getRemainingTimeInMillis()`) and `leaseMargin`, so the delivery after a timeout takes
 * the key over; an explicit `lockTimeout` sets it instead. The handler never throws for one record.
 *
 * ```ts
 * export const handler = idempotentBatch(async (record: SQSRecord) => charge(JSON.parse(record.body)), { store });
 * ```
 */
export function idempotentBatch<R extends BatchRecord>(
  recordHandler: (record: R, context: Context) => unknown,
  options: BatchOptions<R> = {},
): (event: BatchEventOf<R>, context: Context) => Promise<BatchResponse<ItemIdentifierOf<R>>> {
  if (typeof recordHandler !== 'function') {
    throw new IdempotencyOptionsError(
      'recordHandler',
      `must be a function (record, context) => work; got ${typeof recordHandler}.`,
    );
  }
  if (options === null || typeof options !== 'object') {
    throw new IdempotencyOptionsError(
      'options',
      'must be an object; pass {} or leave it out for the defaults.',
    );
  }
  for (const name of ['retryDelay', 'inProgressDelay'] as const) {
    if (name in options) {
      throw new IdempotencyOptionsError(
        name,
        "has no effect on a Lambda event source: Lambda delivers a reported record again after the queue's visibility timeout (SQS) or at once (streams, Kafka). Remove it; set the visibility timeout or the mapping's retry settings instead.",
      );
    }
  }
  const concurrency = options.concurrency ?? DEFAULT_CONCURRENCY;
  if (typeof concurrency !== 'number' || !Number.isSafeInteger(concurrency) || concurrency < 1) {
    throw new IdempotencyOptionsError(
      'concurrency',
      `must be a positive integer; got ${JSON.stringify(concurrency)}.`,
    );
  }
  const { onDeadLetter, onSettled } = options;
  if (onDeadLetter !== undefined && typeof onDeadLetter !== 'function') {
    throw new IdempotencyOptionsError(
      'onDeadLetter',
      `must be a function (record, { reason, error }) => work; got ${typeof onDeadLetter}.`,
    );
  }
  if (onSettled !== undefined && typeof onSettled !== 'function') {
    throw new IdempotencyOptionsError('onSettled', `must be a function; got ${typeof onSettled}.`);
  }
  const partial = options.partialBatchResponse ?? true;
  if (typeof partial !== 'boolean') {
    throw new IdempotencyOptionsError(
      'partialBatchResponse',
      `must be true or false; got ${JSON.stringify(partial)}.`,
    );
  }

  // The SQS views of the records being handled, so that the key and the fingerprint read each record once.
  const views = new WeakMap<object, SqsMessageView>();
  const viewOf = (record: R): SqsMessageView | undefined => views.get(record);
  let keyOf: (record: R) => string | undefined;
  try {
    keyOf = keyFunction<R>(options.key, viewOf);
  } catch (error) {
    throw new IdempotencyOptionsError('key', (error as Error).message);
  }
  const {
    key: _key,
    concurrency: _c,
    onDeadLetter: _d,
    partialBatchResponse: _p,
    leaseMargin: _m,
    onSettled: _s,
    ...shared
  } = options;
  // Every decision below passes its work (the record handler with this invocation's context): the runtime's own
  // handler is never called.
  const unused = (): never => {
    throw new Error('oncely: idempotentBatch decides each record with its work');
  };
  const runtime = consumerRuntime<R>(unused, shared, {
    name: '@oncely/lambda',
    // Read here, not by the runtime; named so that an unknown option's error lists them.
    options: ['key', 'concurrency', 'onDeadLetter', 'partialBatchResponse', 'leaseMargin'],
    keyOf,
    fingerprint: defaultFingerprint<R>(viewOf),
  });
  const { log } = runtime;
  // An explicit lockTimeout wins: the lease then ignores the deadline.
  const marginMs =
    options.lockTimeout !== undefined
      ? undefined
      : options.leaseMargin === undefined
        ? DEFAULT_MARGIN_MS
        : durationOption('leaseMargin', options.leaseMargin);

  const report = (event: BatchSettledEvent<R>): void => {
    if (onSettled === undefined) return;
    try {
      const returned: unknown = onSettled(event);
      if (returned instanceof Promise) {
        returned.catch((error: unknown) => log.error({ err: error }, 'oncely: onSettled rejected; ignored'));
      }
    } catch (error) {
      log.error({ err: error }, 'oncely: onSettled threw; ignored');
    }
  };

  // Records run one after another within a FIFO group or a Kafka partition; on a standard queue, records with one
  // key do too, so that a duplicate inside the batch waits for the first and is recognised instead of reported.
  const orderOf = (kind: SourceKind, item: Item<R>): string | undefined => {
    const group = groupOf(kind, item as Item<BatchRecord>);
    if (group !== undefined || kind !== 'sqs') return group === undefined ? undefined : `g:${group}`;
    let key: string | undefined;
    try {
      key = keyOf(item.record);
    } catch {
      return undefined;
    }
    return key === undefined ? undefined : `k:${key}`;
  };

  return async (event, context) => {
    const batch = batchOf(event);
    const items = batch.items as Item<R>[];
    for (const item of items) if (item.view !== undefined) views.set(item.record, item.view);
    const lease = marginMs === undefined ? undefined : leaseOf(context, marginMs);
    const slots = semaphore(concurrency);
    // The records settled (run or decided); the others were stopped behind their group's first failure.
    const seen = new Set<Item<R>>();

    /** Settles one record; resolves to whether it is done (not reported). Never rejects: a surprise reports it. */
    const settle = async (item: Item<R>): Promise<boolean> => {
      try {
        return await settleRecord(item);
      } catch (error) {
        log.error({ err: error, item: item.id }, 'oncely: could not settle a record; it is reported');
        return false;
      }
    };

    const settleRecord = async (item: Item<R>): Promise<boolean> => {
      seen.add(item);
      const before = failuresBefore(item as Item<BatchRecord>);
      const { key, settlement } = await slots(() =>
        runtime.decide(item.record, before, () => recordHandler(item.record, context), lease),
      );
      let done: boolean;
      switch (settlement.action) {
        case 'ack':
          done = true;
          break;
        case 'delay':
        case 'retry':
          done = false;
          break;
        case 'dead-letter':
          done = await deadLetter(item, key, settlement, batch.kind === 'sqs');
          break;
      }
      const failures =
        settlement.action === 'retry'
          ? settlement.failures
          : settlement.action === 'dead-letter' && settlement.reason === 'retries-exhausted'
            ? before + 1
            : before;
      report({ ...runtime.settledEvent(item.record, key, settlement, failures), reported: !done });
      return done;
    };

    const deadLetter = async (
      item: Item<R>,
      key: string | undefined,
      settlement: Extract<ConsumerSettlement, { action: 'dead-letter' }>,
      queue: boolean,
    ): Promise<boolean> => {
      const letter: DeadLetter = { reason: settlement.reason };
      if (settlement.error !== undefined) letter.error = settlement.error;
      const fields = { key, item: item.id, reason: settlement.reason, err: settlement.error };
      if (onDeadLetter !== undefined) {
        try {
          await onDeadLetter(item.record, letter);
          log.warn(fields, 'oncely: record handed to onDeadLetter');
          return true;
        } catch (error) {
          log.error({ ...fields, err: error }, 'oncely: onDeadLetter failed; the record is reported');
          return false;
        }
      }
      if (queue) {
        log.warn(fields, "oncely: record reported for the queue's redrive policy (no retry can fix it)");
        return false;
      }
      log.error(
        fields,
        'oncely: record skipped: no retry can fix it, and a reported record would hold its shard',
      );
      return true;
    };

    const settled =
      batch.kind === 'kinesis' || batch.kind === 'dynamodb'
        ? await inGroupOrder(items, () => undefined, settle, { stopAll: true })
        : await inGroupOrder(items, (item) => orderOf(batch.kind, item), settle);
    const batchItemFailures: BatchItemFailure[] = [];
    settled.forEach((done, i) => {
      const item = items[i] as Item<R>;
      if (done) return;
      batchItemFailures.push({ itemIdentifier: item.id });
      if (!seen.has(item)) {
        report({
          key: undefined,
          action: 'delay',
          reason: 'group-stopped',
          failures: failuresBefore(item as Item<BatchRecord>),
          message: item.record,
          reported: true,
        });
      }
    });
    if (!partial && batchItemFailures.length > 0) throw new BatchRetryError(batchItemFailures, items.length);
    return { batchItemFailures } as BatchResponse<ItemIdentifierOf<R>>;
  };
}

/** The lease bound of this invocation: its deadline and a margin, when the context tells it. */
function leaseOf(context: Context | undefined, marginMs: number): LeaseSettings | undefined {
  const remaining =
    typeof context?.getRemainingTimeInMillis === 'function' ? context.getRemainingTimeInMillis() : NaN;
  if (!Number.isFinite(remaining)) return undefined;
  return { endsAt: Date.now() + Math.max(0, remaining) + marginMs };
}

/** Runs at most `limit` tasks at once, in the order they ask. */
function semaphore(limit: number): <T>(task: () => Promise<T>) => Promise<T> {
  let running = 0;
  const waiting: Array<() => void> = [];
  return async (task) => {
    // A finishing task hands its slot to the next waiting one, so that no newcomer slips in between.
    if (running >= limit) await new Promise<void>((resolve) => waiting.push(resolve));
    else running++;
    try {
      return await task();
    } finally {
      const next = waiting.shift();
      if (next === undefined) running--;
      else next();
    }
  };
}
