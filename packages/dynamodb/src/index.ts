/**
 * A store in DynamoDB for oncely: {@link DynamoDBStore}, one conditional write per step, with fencing tokens and a
 * TTL attribute that lets DynamoDB delete expired records.
 *
 * @module @oncely/dynamodb
 */
export { type CreateTableResult, DynamoDBStore, type DynamoDBStoreOptions } from './store';
