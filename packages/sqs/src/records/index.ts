/**
 * One reading of an SQS message, whichever way it arrived (the SDK's `ReceiveMessage`, as sqs-consumer hands it, or
 * a Lambda event's SQS record), so that its key, its fingerprint and its FIFO group order are decided the same way by
 * `@oncely/sqs` and `@oncely/lambda`. It imports no AWS package.
 *
 * @module @oncely/sqs/records
 */
import { createHash } from 'node:crypto';

/** An SQS message as `@aws-sdk/client-sqs` (and sqs-consumer) hand it: the fields oncely reads. */
export interface SdkSqsMessage {
  /** SQS's id of this send: a message without one is refused. */
  MessageId?: string | undefined;
  /** The handle of this receive: how the message is deleted or its visibility changed; never a key. */
  ReceiptHandle?: string | undefined;
  /** The message's body: the fingerprint is computed from it, and `{ bodyField }` keys read it. */
  Body?: string | undefined;
  /** System attributes, present when the receive asked for them (`MessageSystemAttributeNames: ['All']`). */
  Attributes?: Partial<Record<string, string>> | undefined;
  /** The message attributes the producer set, present when the receive asked for them (`MessageAttributeNames`). */
  MessageAttributes?:
    | Record<
        string,
        | {
            /** The value of a `String` or `Number` attribute. */
            StringValue?: string | undefined;
            /** `String`, `Number` or `Binary`, with an optional custom suffix (`Number.float`). */
            DataType?: string | undefined;
          }
        | undefined
      >
    | undefined;
}

/** The SQS record of a Lambda event (`SQSRecord` of @types/aws-lambda): the fields oncely reads. */
export interface LambdaSqsRecord {
  /** SQS's id of this send: a record without one is refused. */
  messageId: string;
  /** The handle of this receive; never a key. */
  receiptHandle?: string;
  /** The message's body: the fingerprint is computed from it, and `{ bodyField }` keys read it. */
  body: string;
  /** The system attributes Lambda passes on. */
  attributes: {
    /** How many times the message has been received, this receive included, as a decimal string. */
    ApproximateReceiveCount?: string;
    /** The message group of a FIFO queue. */
    MessageGroupId?: string;
    /** The deduplication id of a FIFO queue (the producer's, or SQS's hash of the body). */
    MessageDeduplicationId?: string;
  };
  /** The message attributes the producer set. */
  messageAttributes?: Record<
    string,
    | {
        /** The value of a `String` or `Number` attribute. */
        stringValue?: string | undefined;
        /** `String`, `Number` or `Binary`, with an optional custom suffix (`Number.float`). */
        dataType?: string;
      }
    | undefined
  >;
  /** `'aws:sqs'`: how a Lambda event's records are told apart by source. */
  eventSource?: string;
  /** The ARN of the queue the record came from. */
  eventSourceARN?: string;
}

/** One SQS message reduced to what oncely reads, whichever source delivered it. */
export interface SqsMessageView {
  /** SQS's id of this send: a producer that sends the same message twice gets two ids. */
  readonly messageId: string;
  /** The message's body (`''` when it had none): the fingerprint is computed from it. */
  readonly body: string;
  /** The message group of a FIFO queue; `undefined` on a standard queue. */
  readonly groupId: string | undefined;
  /** The deduplication id of a FIFO queue (the producer's, or SQS's hash of the body); else `undefined`. */
  readonly deduplicationId: string | undefined;
  /**
   * `ApproximateReceiveCount` (1 on a first delivery), or `undefined` when the receive did not ask for system
   * attributes. It counts every receive, including those that oncely delayed because the key was held elsewhere.
   */
  readonly receiveCount: number | undefined;
  /** The value of a `String` or `Number` message attribute, or `undefined` (absent, or `Binary`). */
  attribute(name: string): string | undefined;
}

/** The view of a message from `ReceiveMessage` or sqs-consumer. A message without `MessageId` or `Body` is refused. */
export function viewOfSdkMessage(message: SdkSqsMessage): SqsMessageView {
  if (typeof message?.MessageId !== 'string') {
    throw new TypeError('oncely: an SQS message without a MessageId (is it a ReceiveMessage result?)');
  }
  const system = message.Attributes ?? {};
  const attributes = message.MessageAttributes;
  return {
    messageId: message.MessageId,
    body: message.Body ?? '',
    groupId: system.MessageGroupId,
    deduplicationId: system.MessageDeduplicationId,
    receiveCount: countOf(system.ApproximateReceiveCount),
    attribute: (name) => stringValue(attributes?.[name]?.DataType, attributes?.[name]?.StringValue),
  };
}

/** The view of an SQS record of a Lambda event. */
export function viewOfLambdaRecord(record: LambdaSqsRecord): SqsMessageView {
  if (typeof record?.messageId !== 'string') {
    throw new TypeError('oncely: an SQS record without a messageId (is it an SQS event record?)');
  }
  const system = record.attributes ?? {};
  const attributes = record.messageAttributes;
  return {
    messageId: record.messageId,
    body: record.body ?? '',
    groupId: system.MessageGroupId,
    deduplicationId: system.MessageDeduplicationId,
    receiveCount: countOf(system.ApproximateReceiveCount),
    attribute: (name) => stringValue(attributes?.[name]?.dataType, attributes?.[name]?.stringValue),
  };
}

function countOf(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  return Number.isInteger(n) && n >= 1 ? n : undefined;
}

function stringValue(dataType: string | undefined, value: string | undefined): string | undefined {
  // `Number.float` and `String.custom` are custom types of String and Number; Binary values are not keys.
  if (value === undefined || dataType?.startsWith('Binary') === true) return undefined;
  return value;
}

/** The message attribute the default key reads: a producer sets it on each send (`MessageAttributes`). */
export const DEFAULT_KEY_ATTRIBUTE = 'Idempotency-Key';

/**
 * Where an SQS message's idempotency key comes from. `M` is the source's own message type (the SDK's `Message`, a
 * Lambda `SQSRecord`), which a function receives.
 */
export type SqsKeySource<M> =
  /** A `String` message attribute the producer sets on each send, e.g. `{ attribute: 'Idempotency-Key' }`. */
  | {
      /** The attribute's name. */
      attribute: string;
    }
  /** A top-level field of a JSON body (a string or a finite number), e.g. `{ bodyField: 'orderId' }`. */
  | {
      /** The field's name. */
      bodyField: string;
    }
  /**
   * `MessageDeduplicationId` within its message group (`<group length>:<group>/<id>`, see `deduplicationKey`);
   * `undefined` on a standard queue.
   */
  | 'deduplicationId'
  /** `MessageId`: deduplicates redeliveries of one send only; two sends of the same message get two ids. */
  | 'messageId'
  /** Your own function of the message; return `undefined` when it has no key. */
  | ((message: M) => string | undefined);

/**
 * The key a FIFO message's deduplication id stands for: the id within its message group, since a queue that
 * deduplicates per group (high-throughput FIFO) holds the same id in two groups as two messages. The group's length
 * leads, so that no two (group, id) pairs give the same key. `undefined` without a deduplication id.
 */
export function deduplicationKey(view: SqsMessageView): string | undefined {
  const id = view.deduplicationId;
  if (id === undefined) return undefined;
  const group = view.groupId;
  return group === undefined ? id : `${group.length}:${group}/${id}`;
}

/**
 * The key function for `source`, over the view and the source's own message. Without a source, the default: the
 * `Idempotency-Key` attribute when the producer set one, else `MessageDeduplicationId` within its group (FIFO:
 * `deduplicationKey`), else `MessageId`. The
 * receipt handle is never a key: it changes on every receive. A `source` that is none of the forms above throws a
 * `TypeError` naming it (wrappers check it once, at construction).
 */
export function sqsKeyOf<M>(
  source: SqsKeySource<M> | undefined,
): (view: SqsMessageView, message: M) => string | undefined {
  if (source === undefined) {
    return (view) => view.attribute(DEFAULT_KEY_ATTRIBUTE) ?? deduplicationKey(view) ?? view.messageId;
  }
  if (typeof source === 'function') return (_view, message) => source(message);
  if (source === 'messageId') return (view) => view.messageId;
  if (source === 'deduplicationId') return deduplicationKey;
  if (source !== null && typeof source === 'object') {
    if ('attribute' in source && typeof source.attribute === 'string' && source.attribute !== '') {
      const name = source.attribute;
      return (view) => view.attribute(name);
    }
    if ('bodyField' in source && typeof source.bodyField === 'string' && source.bodyField !== '') {
      const field = source.bodyField;
      return (view) => bodyField(view.body, field);
    }
  }
  throw new TypeError(
    `must be { attribute: 'Name' }, { bodyField: 'name' }, 'deduplicationId', 'messageId' or a function (message) => string | undefined; got ${describe(source)}.`,
  );
}

/** A top-level string or finite-number field of a JSON body, or `undefined` (not JSON, not an object, absent). */
export function bodyField(body: string, field: string): string | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    return undefined;
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return undefined;
  const value = Object.hasOwn(parsed, field) ? (parsed as Record<string, unknown>)[field] : undefined;
  if (typeof value === 'string') return value;
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  return undefined;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'object') return JSON.stringify(value) ?? typeof value;
  return typeof value === 'string' ? JSON.stringify(value) : typeof value;
}

/**
 * The default fingerprint of an SQS message: SHA-256 of its body (message attributes are not part of it, so a
 * producer may add tracing attributes on a resend). A key reused with another body is a mismatch.
 */
export function sqsFingerprint(view: SqsMessageView): string {
  return createHash('sha256').update(view.body).digest('base64url');
}

/**
 * Processes `items` in the order SQS FIFO requires: the items of one group one after another, in order, and the
 * first that fails (`process` resolves `false`) stops its group, whose later items are not processed and are
 * reported failed too. Items without a group (a standard queue) and different groups run concurrently. With
 * `stopAll`, the first failure stops every group (an ordered stream's shard, where the source retries from the first
 * failed record). Resolves to whether each item succeeded, in the order given; never rejects unless
 * `process` does.
 */
export async function inGroupOrder<T>(
  items: readonly T[],
  groupOf: (item: T) => string | undefined,
  process: (item: T) => Promise<boolean>,
  options: { stopAll?: boolean } = {},
): Promise<boolean[]> {
  const done: boolean[] = new Array<boolean>(items.length).fill(false);
  if (options.stopAll === true) {
    for (let i = 0; i < items.length; i++) {
      if (!(await process(items[i] as T))) break;
      done[i] = true;
    }
    return done;
  }
  const groups = new Map<string, number[]>();
  const ungrouped: number[] = [];
  items.forEach((item, i) => {
    const group = groupOf(item);
    if (group === undefined) ungrouped.push(i);
    else {
      const indexes = groups.get(group);
      if (indexes === undefined) groups.set(group, [i]);
      else indexes.push(i);
    }
  });
  await Promise.all([
    ...ungrouped.map(async (i) => {
      done[i] = await process(items[i] as T);
    }),
    ...[...groups.values()].map(async (indexes) => {
      for (const i of indexes) {
        if (!(await process(items[i] as T))) return;
        done[i] = true;
      }
    }),
  ]);
  return done;
}
