// Type tests of idempotentBatch: this file is not run, only compiled (`npm run typecheck` includes test/). Each
// `@ts-expect-error` fails the type check when the line under it compiles.
import { MemoryStore } from '@oncely/core';
import type {
  DynamoDBRecord,
  DynamoDBStreamHandler,
  KinesisStreamEvent,
  KinesisStreamRecord,
  MSKEvent,
  MSKRecord,
  SelfManagedKafkaEvent,
  SQSEvent,
  SQSHandler,
  SQSRecord,
} from 'aws-lambda';
import { type BatchResponse, idempotentBatch, type KafkaItemIdentifier } from '../src/index';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only when `A` and `B` are the same type. */
const same = <A, B>(_proof: Equal<A, B>): void => undefined;

const store = new MemoryStore();

export function theEventFollowsTheRecordType(): void {
  const sqs = idempotentBatch(async (record: SQSRecord) => record.body, { store });
  same<Parameters<typeof sqs>[0], SQSEvent>(true);
  same<Awaited<ReturnType<typeof sqs>>, BatchResponse<string>>(true);
  const kinesis = idempotentBatch(async (record: KinesisStreamRecord) => record.kinesis.data, { store });
  same<Parameters<typeof kinesis>[0], KinesisStreamEvent>(true);
  const kafka = idempotentBatch(async (record: MSKRecord) => record.value, { store });
  same<Parameters<typeof kafka>[0], MSKEvent | SelfManagedKafkaEvent>(true);
  same<Awaited<ReturnType<typeof kafka>>, BatchResponse<KafkaItemIdentifier>>(true);
  // @ts-expect-error an SQS handler does not take a Kinesis event
  void sqs({ Records: [] } as KinesisStreamEvent, {} as never);
}

export function theHandlerIsWhatLambdaTypesExpect(): void {
  const sqs: SQSHandler = idempotentBatch(async (_record: SQSRecord) => {}, { store });
  const dynamodb: DynamoDBStreamHandler = idempotentBatch(async (_record: DynamoDBRecord) => {}, { store });
  void sqs;
  void dynamodb;
}

export function optionsSeeTheRecordType(): void {
  idempotentBatch(async (_record: SQSRecord) => {}, {
    store,
    key: (record) => record.messageAttributes.orderId?.stringValue,
    fingerprint: (record) => record.body,
    onDeadLetter: async (record, { reason }) => `${record.messageId} ${reason}`,
    onSettled: (event) => void [event.message.messageId, event.reported],
  });
  idempotentBatch(async (_record: SQSRecord) => {}, {
    // @ts-expect-error a Kinesis record's fields are not an SQS record's
    key: (record) => record.kinesis.partitionKey,
  });
  // @ts-expect-error Lambda decides when a reported record comes again
  idempotentBatch(async (_record: SQSRecord) => {}, { retryDelay: '1s' });
}
