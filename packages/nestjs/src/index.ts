export { IdempotencyKey, Idempotent, type IdempotentSetting } from './decorators';
export { IdempotencyModule } from './idempotency.module';
export type {
  IdempotencyModuleAsyncOptions,
  IdempotencyModuleOptions,
  IdempotentOptions,
  IdempotentRequest,
} from './options';
