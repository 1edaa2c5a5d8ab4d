/**
 * Idempotency keys for AWS Lambda with oncely: HTTP events (API Gateway, Function URLs, ALB; a handler wrapper,
 * Middy middleware and the Powertools HTTP router), and SQS, Kinesis, DynamoDB Streams and Kafka batches answered
 * with `batchItemFailures`.
 *
 * @module @oncely/lambda
 */
export * from './batch';
export * from './http';
