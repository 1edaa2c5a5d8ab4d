// What differs between Lambda's batch event sources: how records are found in the event, what identifies one in a
// partial batch response, its default key and fingerprint, and the order Lambda needs them processed in. SQS records
// are read through @oncely/sqs/records, the translation @oncely/sqs uses too.
import { createHash } from 'node:crypto';
import { canonicalJson } from '@oncely/core/adapter';
import {
  bodyField,
  type SqsMessageView,
  sqsFingerprint,
  sqsKeyOf,
  viewOfLambdaRecord,
} from '@oncely/sqs/records';
import type {
  DynamoDBRecord,
  KinesisStreamRecord,
  MSKRecord,
  SelfManagedKafkaRecord,
  SQSRecord,
} from 'aws-lambda';

/** A Kafka record of an Amazon MSK or self-managed Apache Kafka event (the two have the same shape). */
export type KafkaRecord = MSKRecord | SelfManagedKafkaRecord;

/** A record of any batch event `idempotentBatch` handles. */
export type BatchRecord = SQSRecord | KinesisStreamRecord | DynamoDBRecord | KafkaRecord;

/** The partial batch response's identifier of a Kafka record: its topic-partition and offset. */
export interface KafkaItemIdentifier {
  /** `<topic>-<partition>`, as the event's `records` map names it. */
  partition: string;
  /** The record's offset in its partition. */
  offset: number;
}

/** One entry of `batchItemFailures`: a record Lambda must deliver again. */
export interface BatchItemFailure {
  /** SQS: `messageId`; Kinesis: `kinesis.sequenceNumber`; DynamoDB Streams: `dynamodb.SequenceNumber`; Kafka: `{ partition, offset }`. */
  itemIdentifier: string | KafkaItemIdentifier;
}

/**
 * Where a record's idempotency key comes from. Each form reads what the source has; a record without it has no
 * key (settled as the `onMissingKey` option says):
 * - `{ bodyField: 'orderId' }`: a top-level string or number field of the JSON payload: the SQS body, the Kinesis
 *   `data` or the Kafka `value` (both base64, decoded as UTF-8), the DynamoDB `NewImage` (or `OldImage` on a
 *   `REMOVE`) attribute of type `S` or `N`;
 * - `{ attribute: 'Idempotency-Key' }`: an SQS `String`/`Number` message attribute, or a Kafka header (UTF-8);
 * - `'deduplicationId'` / `'messageId'`: SQS only;
 * - a function of the record, returning `undefined` when it has none.
 */
export type BatchKeySource<R> =
  | {
      /** The payload field's name. */
      bodyField: string;
    }
  | {
      /** The message attribute's or Kafka header's name. */
      attribute: string;
    }
  | 'deduplicationId'
  | 'messageId'
  | ((record: R) => string | undefined);

/** The sources, as Lambda's events name them. */
export type SourceKind = 'sqs' | 'kinesis' | 'dynamodb' | 'kafka';

/** A record found in an event, with what the handler needs of it beside the record. */
export interface Item<R> {
  readonly record: R;
  /** The partial batch response's identifier. */
  readonly id: string | KafkaItemIdentifier;
  /** The SQS view (SQS records only): key and fingerprint read it. */
  readonly view: SqsMessageView | undefined;
}

/** An event's records, the kind of source, and its ordering. */
export interface Batch<R> {
  readonly kind: SourceKind;
  readonly items: Item<R>[];
}

const KAFKA_SOURCES = new Set(['aws:kafka', 'SelfManagedKafka', 'aws:SelfManagedKafka']);
const RECORD_SOURCES: Readonly<Record<string, SourceKind>> = {
  'aws:sqs': 'sqs',
  'aws:kinesis': 'kinesis',
  'aws:dynamodb': 'dynamodb',
};

/**
 * The records of `event` with their identifiers. Throws a `TypeError` for an event that is none of the batch events,
 * or a record without its identifier: such an event cannot be answered record by record, so the whole invocation
 * fails and Lambda retries it (the function is likely wired to the wrong trigger).
 */
export function batchOf(event: unknown): Batch<BatchRecord> {
  const e = event as { Records?: unknown; records?: unknown; eventSource?: unknown } | null | undefined;
  if (e !== null && typeof e === 'object' && Array.isArray(e.Records)) {
    const records = e.Records as Array<{ eventSource?: unknown }>;
    if (records.length === 0) return { kind: 'sqs', items: [] };
    const source = String(records[0]?.eventSource);
    const kind = RECORD_SOURCES[source];
    if (kind === undefined) {
      throw new TypeError(
        `oncely: idempotentBatch handles SQS, Kinesis, DynamoDB Streams and Kafka events; got records of ${JSON.stringify(source)}.`,
      );
    }
    const items = records.map((record, i) => {
      if (record?.eventSource !== source) {
        throw new TypeError(
          `oncely: record ${i} of a ${source} event comes from ${String(record?.eventSource)}.`,
        );
      }
      return itemOf(kind, record as BatchRecord, i);
    });
    return { kind, items };
  }
  if (
    e !== null &&
    typeof e === 'object' &&
    KAFKA_SOURCES.has(String(e.eventSource)) &&
    e.records !== null &&
    typeof e.records === 'object'
  ) {
    const items: Item<BatchRecord>[] = [];
    for (const partition of Object.values(e.records as Record<string, unknown>)) {
      if (!Array.isArray(partition))
        throw new TypeError('oncely: a Kafka event whose records are not arrays.');
      for (const record of partition) items.push(itemOf('kafka', record as BatchRecord, items.length));
    }
    return { kind: 'kafka', items };
  }
  throw new TypeError(
    'oncely: idempotentBatch handles SQS, Kinesis, DynamoDB Streams and Kafka events (with Records, or a Kafka event with records); got something else. Is the function wired to another trigger?',
  );
}

function itemOf(kind: SourceKind, record: BatchRecord, index: number): Item<BatchRecord> {
  const missing = (what: string) =>
    new TypeError(`oncely: record ${index} of the ${kind} event has no ${what}.`);
  switch (kind) {
    case 'sqs': {
      const view = viewOfLambdaRecord(record as SQSRecord);
      return { record, id: view.messageId, view };
    }
    case 'kinesis': {
      const id = (record as KinesisStreamRecord).kinesis?.sequenceNumber;
      if (typeof id !== 'string' || id === '') throw missing('kinesis.sequenceNumber');
      return { record, id, view: undefined };
    }
    case 'dynamodb': {
      const id = (record as DynamoDBRecord).dynamodb?.SequenceNumber;
      if (typeof id !== 'string' || id === '') throw missing('dynamodb.SequenceNumber');
      return { record, id, view: undefined };
    }
    case 'kafka': {
      const { topic, partition, offset } = (record ?? {}) as Partial<KafkaRecord>;
      if (typeof topic !== 'string' || partition === undefined || typeof offset !== 'number') {
        throw missing('topic, partition and offset');
      }
      return { record, id: { partition: `${topic}-${partition}`, offset }, view: undefined };
    }
  }
}

/** The kind of a record handed to a key or fingerprint function (records carry it, except Kafka's). */
function kindOf(record: BatchRecord): SourceKind {
  const source = (record as { eventSource?: unknown }).eventSource;
  return (typeof source === 'string' ? RECORD_SOURCES[source] : undefined) ?? 'kafka';
}

/**
 * The key function for `source`, or the defaults: SQS: the `Idempotency-Key` message attribute, else
 * `MessageDeduplicationId` within its message group (FIFO), else `messageId`; Kinesis: `<stream name>/<eventID>` (the shard and sequence
 * number); DynamoDB Streams: `eventID`; Kafka: `<topic>-<partition>@<offset>`. Throws a `TypeError` for a
 * `source` of none of the forms (checked once, at construction).
 */
export function keyFunction<R extends BatchRecord>(
  source: BatchKeySource<R> | undefined,
  viewOf: (record: R) => SqsMessageView | undefined,
): (record: R) => string | undefined {
  const sqsKey = sqsKeyOf<R>(source);
  if (typeof source === 'function') return (record) => source(record);
  const field =
    source !== null && typeof source === 'object' && 'bodyField' in source ? source.bodyField : undefined;
  const attribute =
    source !== null && typeof source === 'object' && 'attribute' in source ? source.attribute : undefined;
  return (record) => {
    const kind = kindOf(record);
    if (kind === 'sqs') {
      const view = viewOf(record) ?? viewOfLambdaRecord(record as SQSRecord);
      return sqsKey(view, record);
    }
    if (source === undefined) return defaultKey(kind, record);
    if (field !== undefined) return fieldOf(kind, record, field);
    if (attribute !== undefined && kind === 'kafka') return kafkaHeader(record as KafkaRecord, attribute);
    return undefined;
  };
}

function defaultKey(kind: SourceKind, record: BatchRecord): string | undefined {
  switch (kind) {
    case 'kinesis': {
      const r = record as KinesisStreamRecord;
      if (typeof r.eventID !== 'string' || r.eventID === '') return undefined;
      const stream = streamName(r.eventSourceARN);
      return stream === undefined ? r.eventID : `${stream}/${r.eventID}`;
    }
    case 'dynamodb': {
      const id = (record as DynamoDBRecord).eventID;
      return typeof id === 'string' && id !== '' ? id : undefined;
    }
    default: {
      const r = record as KafkaRecord;
      return `${r.topic}-${r.partition}@${r.offset}`;
    }
  }
}

/** `arn:aws:kinesis:<region>:<account>:stream/<name>` → `<name>`. */
function streamName(arn: string | undefined): string | undefined {
  if (typeof arn !== 'string') return undefined;
  const at = arn.lastIndexOf(':stream/');
  return at === -1 ? undefined : arn.slice(at + ':stream/'.length);
}

function fieldOf(kind: SourceKind, record: BatchRecord, field: string): string | undefined {
  if (kind === 'dynamodb') {
    const stream = (record as DynamoDBRecord).dynamodb;
    const value = (stream?.NewImage ?? stream?.OldImage)?.[field];
    if (value === undefined) return undefined;
    if (typeof value.S === 'string') return value.S;
    if (typeof value.N === 'string') return value.N;
    return undefined;
  }
  const payload =
    kind === 'kinesis' ? (record as KinesisStreamRecord).kinesis?.data : (record as KafkaRecord).value;
  if (typeof payload !== 'string') return undefined;
  return bodyField(Buffer.from(payload, 'base64').toString('utf8'), field);
}

function kafkaHeader(record: KafkaRecord, name: string): string | undefined {
  for (const header of record.headers ?? []) {
    const bytes = header?.[name];
    if (Array.isArray(bytes)) return Buffer.from(bytes).toString('utf8');
  }
  return undefined;
}

/**
 * The default fingerprint: SHA-256 of the payload: the SQS body, the Kinesis `data`, the Kafka `value` (and its key),
 * or a DynamoDB record's event name, keys and images. A key reused with another payload is a mismatch.
 */
export function defaultFingerprint<R extends BatchRecord>(
  viewOf: (record: R) => SqsMessageView | undefined,
): (record: R) => string {
  return (record) => {
    const kind = kindOf(record);
    if (kind === 'sqs') return sqsFingerprint(viewOf(record) ?? viewOfLambdaRecord(record as SQSRecord));
    const hash = createHash('sha256');
    if (kind === 'kinesis') hash.update((record as KinesisStreamRecord).kinesis?.data ?? '');
    else if (kind === 'kafka') {
      const r = record as KafkaRecord;
      hash.update(`${r.key ?? ''}\n${r.value ?? ''}`);
    } else {
      const r = record as DynamoDBRecord;
      const { Keys, NewImage, OldImage } = r.dynamodb ?? {};
      hash.update(canonicalJson({ eventName: r.eventName, Keys, NewImage, OldImage }));
    }
    return hash.digest('base64url');
  };
}

/** Failed attempts before this delivery, where the source counts them (SQS's `ApproximateReceiveCount`). */
export function failuresBefore(item: Item<BatchRecord>): number {
  const received = item.view?.receiveCount;
  return received === undefined ? 0 : received - 1;
}

/** The group whose records must run one after another (FIFO message group, Kafka partition), if any. */
export function groupOf(kind: SourceKind, item: Item<BatchRecord>): string | undefined {
  if (kind === 'sqs') return item.view?.groupId;
  if (kind === 'kafka') return (item.id as KafkaItemIdentifier).partition;
  return undefined;
}
