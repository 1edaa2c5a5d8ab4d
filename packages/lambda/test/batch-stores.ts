/// <reference path="../../dynamodb/test/dynalite.d.ts" />
// The stores the batch tests run on: the Redis on this machine (a random prefix, its keys deleted afterwards) and
// DynamoDB through dynalite (in this process, on a free port, gone when stopped).
import { randomUUID } from 'node:crypto';
import type { IdempotencyStore } from '@oncely/core';
import { DynamoDBStore } from '@oncely/dynamodb';
import { RedisStore } from '@oncely/redis';
import Redis from 'ioredis';
import { type LocalDynamoDB, randomTableName, startDynalite } from '../../dynamodb/test/helpers';

export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

/** Deletes every key under `prefixes` (the tests' own, never the whole database). */
export async function deletePrefixes(client: Redis, prefixes: readonly string[]): Promise<void> {
  for (const prefix of prefixes) {
    let cursor = '0';
    do {
      const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await client.del(...keys);
    } while (cursor !== '0');
  }
}

export interface StoreUnderTest {
  readonly name: 'redis' | 'dynamodb';
  /** Starts what the store needs; `store()` then returns a store on it (a fresh namespace per call). */
  start(): Promise<void>;
  store(): IdempotencyStore;
  stop(): Promise<void>;
}

export function redisUnderTest(): StoreUnderTest {
  let client: Redis | undefined;
  const prefixes: string[] = [];
  return {
    name: 'redis',
    async start() {
      client = new Redis(REDIS_URL);
    },
    store() {
      const prefix = `oncely-lambda-test:${randomUUID().slice(0, 8)}:`;
      prefixes.push(prefix);
      return new RedisStore({ client: client as Redis, prefix });
    },
    async stop() {
      if (client === undefined) return;
      await deletePrefixes(client, prefixes);
      await client.quit();
    },
  };
}

export function dynamodbUnderTest(): StoreUnderTest {
  let local: LocalDynamoDB | undefined;
  let table: DynamoDBStore | undefined;
  const tableName = randomTableName();
  return {
    name: 'dynamodb',
    async start() {
      local = await startDynalite({ returnOldItem: true });
      table = new DynamoDBStore({ client: local.client(), tableName });
      await table.createTable();
    },
    store() {
      return new DynamoDBStore({
        client: (local as LocalDynamoDB).client(),
        tableName,
        prefix: `oncely-lambda-test:${randomUUID().slice(0, 8)}:`,
      });
    },
    async stop() {
      await local?.stop();
    },
  };
}
