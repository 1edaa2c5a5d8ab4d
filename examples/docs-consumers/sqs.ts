import { SQSClient } from '@aws-sdk/client-sqs';
import { idempotentHandleMessage } from '@oncely/sqs';
import { Consumer } from 'sqs-consumer';
import { chargeCard, type Order, store } from './app.js';

const sqs = new SQSClient({});
const queueUrl = process.env.QUEUE_URL as string;

const consumer = Consumer.create({
  queueUrl,
  sqs,
  visibilityTimeout: 30, // seconds: the same as the wrapper's visibilityTimeout
  // ApproximateReceiveCount (to count attempts), MessageGroupId and MessageDeduplicationId (FIFO).
  messageSystemAttributeNames: ['All'],
  // The key the producer sets on each send: SQS returns only the attributes asked for.
  messageAttributeNames: ['Idempotency-Key'],
  // No heartbeatInterval (each lease renewal extends the visibility), no alwaysAcknowledge.
  handleMessage: idempotentHandleMessage((message) => chargeCard(JSON.parse(message.Body ?? '') as Order), {
    sqs,
    queueUrl,
    store,
    visibilityTimeout: '30s',
    maxAttempts: 5,
    deadLetterQueueUrl: process.env.DEAD_LETTER_QUEUE_URL,
  }),
});
consumer.start();
