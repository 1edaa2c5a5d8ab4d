// Where the records live: a MemoryStore by default (this process only: enough to show a replay), Redis with
// ONCELY_STORE=redis (REDIS_URL), DynamoDB with ONCELY_STORE=dynamodb (DYNAMODB_ENDPOINT for DynamoDB Local or
// dynalite, else your AWS account's credentials and region; DYNAMODB_TABLE). On Lambda, build it at module scope,
// as here: it is made once per execution environment and connects on the first event, not before.
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { type IdempotencyStore, MemoryStore } from '@oncely/core';
import { DynamoDBStore } from '@oncely/dynamodb';
import { RedisStore } from '@oncely/redis';
import Redis from 'ioredis';

const kind = process.env.ONCELY_STORE ?? 'memory';
const prefix = process.env.ONCELY_PREFIX ?? 'oncely-example-lambda:';

function open(): { store: IdempotencyStore; describe: string; close(): Promise<void> } {
  switch (kind) {
    case 'memory': {
      const store = new MemoryStore();
      return { store, describe: 'MemoryStore (this process only)', close: async () => {} };
    }
    case 'redis': {
      const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
      // lazyConnect: the client connects on the first command, i.e. on the first event, not at import.
      const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
      return {
        store: new RedisStore({ client, prefix }),
        describe: `RedisStore at ${url}`,
        close: async () => void client.disconnect(),
      };
    }
    case 'dynamodb': {
      const endpoint = process.env.DYNAMODB_ENDPOINT;
      const client = new DynamoDBClient(
        endpoint === undefined
          ? { maxAttempts: 2 }
          : {
              endpoint,
              region: 'us-east-1',
              credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
              maxAttempts: 2,
            },
      );
      const tableName = process.env.DYNAMODB_TABLE ?? 'oncely-example-lambda';
      return {
        store: new DynamoDBStore({ client, tableName, prefix }),
        describe: `DynamoDBStore, table ${tableName}${endpoint === undefined ? '' : ` at ${endpoint}`}`,
        close: async () => client.destroy(),
      };
    }
    default:
      throw new Error(`ONCELY_STORE=${kind}: use memory, redis or dynamodb`);
  }
}

export const { store, describe, close } = open();
export const storeKind = kind;
