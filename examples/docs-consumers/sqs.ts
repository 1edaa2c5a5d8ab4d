import { createHash } from 'node:crypto';
import { ChangeMessageVisibilityCommand, SendMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { consumerRuntime } from '@oncely/core/adapter';
import type { SQSBatchItemFailure, SQSBatchResponse, SQSEvent, SQSRecord } from 'aws-lambda';
import { chargeCard, type Order, store } from './app.js';

const sqs = new SQSClient({});
const runtime = consumerRuntime<SQSRecord>(
  (record) => chargeCard(JSON.parse(record.body) as Order),
  // lockTimeout below the queue's visibility timeout: a timed-out invocation's key must be free again by then.
  { store, maxAttempts: 5, lockTimeout: '30s' },
  {
    name: 'sqs orders handler',
    options: [],
    // A business key from the message, not record.messageId (new on every send) nor record.receiptHandle (new on
    // every receive).
    keyOf: (record) => record.messageAttributes['Idempotency-Key']?.stringValue,
    fingerprint: (record) => createHash('sha256').update(record.body).digest('base64url'),
  },
);

export const handler = async (event: SQSEvent): Promise<SQSBatchResponse> => {
  const batchItemFailures: SQSBatchItemFailure[] = [];
  await Promise.all(
    event.Records.map(async (record) => {
      const failures = Number(record.attributes.ApproximateReceiveCount) - 1;
      const { settlement } = await runtime.decide(record, failures);
      if (settlement.action === 'ack') return;
      if (settlement.action === 'dead-letter') {
        await sqs.send(
          new SendMessageCommand({ QueueUrl: process.env.DEAD_LETTER_QUEUE_URL, MessageBody: record.body }),
        );
        return;
      }
      await sqs.send(
        new ChangeMessageVisibilityCommand({
          QueueUrl: process.env.QUEUE_URL,
          ReceiptHandle: record.receiptHandle,
          VisibilityTimeout: Math.ceil(settlement.delayMs / 1000),
        }),
      );
      batchItemFailures.push({ itemIdentifier: record.messageId });
    }),
  );
  return { batchItemFailures };
};
