/// <reference path="../../dynamodb/test/dynalite.d.ts" />
// The two stores the HTTP tests run on: the real Redis and DynamoDB through dynalite.
import { randomBytes } from 'node:crypto';
import type { IdempotencyStore } from '@oncely/core';
import { DynamoDBStore } from '@oncely/dynamodb';
import { RedisStore } from '@oncely/redis';
import Redis from 'ioredis';
import { type LocalDynamoDB, randomTableName, startDynalite } from '../../dynamodb/test/helpers';

export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

export interface TestStores {
  /** A fresh store over a fresh prefix (table). */
  make(): Promise<IdempotencyStore>;
  /** What an app process needs to reach the same store: `{ kind, url|endpoint, prefix|table }`. */
  describe(store: IdempotencyStore): Record<string, string>;
  stop(): Promise<void>;
}

export async function redisStores(): Promise<TestStores> {
  const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  const prefixes: string[] = [];
  // Closed at the end: a store that waited for a key holds a subscriber connection of its own.
  const stores: RedisStore[] = [];
  const described = new WeakMap<IdempotencyStore, Record<string, string>>();
  return {
    async make() {
      const prefix = `oncely-lambda-http-${randomBytes(6).toString('hex')}:`;
      prefixes.push(prefix);
      const store = new RedisStore({ client, prefix });
      stores.push(store);
      described.set(store, { kind: 'redis', url: REDIS_URL, prefix });
      return store;
    },
    describe: (store) => described.get(store) as Record<string, string>,
    async stop() {
      await Promise.all(stores.map((store) => store.close()));
      // Only this file's keys: the database is shared.
      for (const prefix of prefixes) {
        const keys = await client.keys(`${prefix}*`);
        if (keys.length > 0) await client.del(...keys);
      }
      client.disconnect();
    },
  };
}

export async function dynamoStores(): Promise<TestStores> {
  const local: LocalDynamoDB = await startDynalite({ returnOldItem: true });
  const client = local.client();
  const described = new WeakMap<IdempotencyStore, Record<string, string>>();
  return {
    async make() {
      const tableName = randomTableName();
      const store = new DynamoDBStore({ client, tableName });
      await store.createTable();
      described.set(store, { kind: 'dynamodb', endpoint: local.endpoint, table: tableName });
      return store;
    },
    describe: (store) => described.get(store) as Record<string, string>,
    stop: () => local.stop(),
  };
}

export const STORES: ReadonlyArray<[string, () => Promise<TestStores>]> = [
  ['Redis', redisStores],
  ['DynamoDB (dynalite)', dynamoStores],
];

/**
 * Starts the stores before a describe block's tests and stops them after; each test gets a fresh store through
 * `use`. Returns the stores, for `describe(store)`.
 */
export function useStores(
  makeStores: () => Promise<TestStores>,
  use: (store: IdempotencyStore) => void,
): { describe(store: IdempotencyStore): Record<string, string> } {
  let stores: TestStores | undefined;
  beforeAll(async () => {
    stores = await makeStores();
  });
  afterAll(() => stores?.stop());
  beforeEach(async () => {
    use(await (stores as TestStores).make());
  });
  return { describe: (store) => (stores as TestStores).describe(store) };
}
