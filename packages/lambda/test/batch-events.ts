// Batch events as AWS documents them (the sample events of the Lambda developer guide), built for the tests.
import { randomUUID } from 'node:crypto';
import type {
  Context,
  DynamoDBRecord,
  DynamoDBStreamEvent,
  KinesisStreamEvent,
  KinesisStreamRecord,
  MSKEvent,
  MSKRecord,
  SelfManagedKafkaEvent,
  SQSEvent,
  SQSRecord,
} from 'aws-lambda';

export const QUEUE_ARN = 'arn:aws:sqs:us-east-2:123456789012:my-queue';
export const STREAM_ARN = 'arn:aws:kinesis:us-east-2:123456789012:stream/lambda-stream';
export const TABLE_STREAM_ARN =
  'arn:aws:dynamodb:us-east-2:123456789012:table/my-table/stream/2024-06-10T19:26:16.525';

export interface SqsRecordInput {
  body: string;
  messageId?: string;
  /** The `Idempotency-Key` message attribute. */
  key?: string;
  groupId?: string;
  deduplicationId?: string;
  receiveCount?: number;
}

export function sqsRecord(input: SqsRecordInput): SQSRecord {
  const messageId = input.messageId ?? randomUUID();
  return {
    messageId,
    receiptHandle: `AQEB${randomUUID()}`,
    body: input.body,
    attributes: {
      ApproximateReceiveCount: String(input.receiveCount ?? 1),
      SentTimestamp: '1545082649183',
      SenderId: 'AIDAIENQZJOLO23YVJ4VO',
      ApproximateFirstReceiveTimestamp: '1545082649185',
      ...(input.groupId === undefined ? {} : { MessageGroupId: input.groupId, SequenceNumber: '1' }),
      ...(input.deduplicationId === undefined ? {} : { MessageDeduplicationId: input.deduplicationId }),
    },
    messageAttributes:
      input.key === undefined
        ? {}
        : {
            'Idempotency-Key': {
              stringValue: input.key,
              dataType: 'String',
              stringListValues: [],
              binaryListValues: [],
            },
          },
    md5OfBody: 'e4e68fb7bd0e697a0ae8f1bb342846b3',
    eventSource: 'aws:sqs',
    eventSourceARN: input.groupId === undefined ? QUEUE_ARN : `${QUEUE_ARN}.fifo`,
    awsRegion: 'us-east-2',
  };
}

/** The same message received again: same id and body, a new receipt handle and one more receive. */
export function redelivered(record: SQSRecord): SQSRecord {
  return {
    ...record,
    receiptHandle: `AQEB${randomUUID()}`,
    attributes: {
      ...record.attributes,
      ApproximateReceiveCount: String(Number(record.attributes.ApproximateReceiveCount) + 1),
    },
  };
}

export const sqsEvent = (records: SQSRecord[]): SQSEvent => ({ Records: records });

let sequence = 49590338271490256608559692538361571095921575989136588898n;

export function kinesisRecord(data: unknown, shard = 'shardId-000000000006'): KinesisStreamRecord {
  sequence += 1n;
  const sequenceNumber = sequence.toString();
  return {
    kinesis: {
      kinesisSchemaVersion: '1.0',
      partitionKey: '1',
      sequenceNumber,
      data: Buffer.from(JSON.stringify(data)).toString('base64'),
      approximateArrivalTimestamp: 1545084650.987,
    },
    eventSource: 'aws:kinesis',
    eventVersion: '1.0',
    eventID: `${shard}:${sequenceNumber}`,
    eventName: 'aws:kinesis:record',
    invokeIdentityArn: 'arn:aws:iam::123456789012:role/lambda-role',
    awsRegion: 'us-east-2',
    eventSourceARN: STREAM_ARN,
  };
}

export const kinesisEvent = (records: KinesisStreamRecord[]): KinesisStreamEvent => ({ Records: records });

export function dynamodbRecord(id: string, message: string): DynamoDBRecord {
  sequence += 1n;
  return {
    eventID: randomUUID().replaceAll('-', ''),
    eventName: 'INSERT',
    eventVersion: '1.1',
    eventSource: 'aws:dynamodb',
    awsRegion: 'us-east-2',
    dynamodb: {
      Keys: { Id: { N: id } },
      NewImage: { Message: { S: message }, Id: { N: id } },
      SequenceNumber: sequence.toString().slice(0, 21),
      SizeBytes: 26,
      StreamViewType: 'NEW_AND_OLD_IMAGES',
    },
    eventSourceARN: TABLE_STREAM_ARN,
  };
}

export const dynamodbEvent = (records: DynamoDBRecord[]): DynamoDBStreamEvent => ({ Records: records });

export function kafkaRecord(
  topic: string,
  partition: number,
  offset: number,
  value: unknown,
  headers: Record<string, string> = {},
): MSKRecord {
  return {
    topic,
    partition,
    offset,
    timestamp: 1545084650987,
    timestampType: 'CREATE_TIME',
    key: Buffer.from(`key-${offset}`).toString('base64'),
    value: Buffer.from(JSON.stringify(value)).toString('base64'),
    headers: Object.entries(headers).map(([name, text]) => ({ [name]: [...Buffer.from(text)] })),
  };
}

export function mskEvent(records: MSKRecord[]): MSKEvent {
  const grouped: Record<string, MSKRecord[]> = {};
  for (const r of records) {
    const name = `${r.topic}-${r.partition}`;
    grouped[name] = [...(grouped[name] ?? []), r];
  }
  return {
    eventSource: 'aws:kafka',
    eventSourceArn:
      'arn:aws:kafka:us-east-2:123456789012:cluster/vpc-2priv-2pub/751d2973-a626-431c-9d4e-d7975eb44dd7-2',
    bootstrapServers: 'b-2.demo-cluster-1.a1bcde.c1.kafka.us-east-2.amazonaws.com:9092',
    records: grouped,
  };
}

export function selfManagedKafkaEvent(records: MSKRecord[]): SelfManagedKafkaEvent {
  const { records: grouped, bootstrapServers } = mskEvent(records);
  return { eventSource: 'SelfManagedKafka', bootstrapServers, records: grouped };
}

/** A Lambda context whose invocation ends `remainingMs` from now. */
export function lambdaContext(remainingMs = 60_000): Context {
  const deadline = Date.now() + remainingMs;
  return {
    callbackWaitsForEmptyEventLoop: true,
    functionName: 'orders',
    functionVersion: '$LATEST',
    invokedFunctionArn: 'arn:aws:lambda:us-east-2:123456789012:function:orders',
    memoryLimitInMB: '128',
    awsRequestId: randomUUID(),
    logGroupName: '/aws/lambda/orders',
    logStreamName: '2026/11/26/[$LATEST]0123456789abcdef',
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
    done: () => undefined,
    fail: () => undefined,
    succeed: () => undefined,
  };
}
