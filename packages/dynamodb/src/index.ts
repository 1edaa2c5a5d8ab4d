export { type CreateTableResult, DynamoDBStore, type DynamoDBStoreOptions } from './store';
