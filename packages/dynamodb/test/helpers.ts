import { randomBytes } from 'node:crypto';
import type { Server } from 'node:http';
import { type AttributeValue, DynamoDBClient, ScanCommand } from '@aws-sdk/client-dynamodb';
import { freePort } from '@oncely/testing';
import dynalite from 'dynalite';
import type { DynamoDBStore } from '../src';

// The SDK warns once per process that its future releases need Node 22: noise in the test output (and in the app
// processes of the multi-process test, which inherit this environment).
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = 'true';

/** Fake credentials and region: dynalite checks that requests are signed, not by whom. */
export const REGION = 'us-east-1';
export const CREDENTIALS = { accessKeyId: 'oncely-local', secretAccessKey: 'oncely-local' };

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export const randomTableName = () => `oncely-test-${randomBytes(6).toString('hex')}`;

export interface LocalDynamoDB {
  /** `http://127.0.0.1:<port>`, for clients in this process and in app processes. */
  endpoint: string;
  /** A new client on it; destroyed by `stop()`. */
  client(): DynamoDBClient;
  /** Number of items whose partition key starts with `prefix`. */
  countItems(tableName: string, prefix: string): Promise<number>;
  /** Destroys the clients, then closes the server (and its in-memory database). */
  stop(): Promise<void>;
}

/**
 * Starts dynalite in this process, on a free port of 127.0.0.1, in memory. `returnOldItem` adds what dynalite
 * lacks and DynamoDB has: `ReturnValuesOnConditionCheckFailure: 'ALL_OLD'` (see below). Without it, the store's
 * fallback (a consistent GetItem after a failed condition) is what runs.
 */
export async function startDynalite(options: { returnOldItem: boolean }): Promise<LocalDynamoDB> {
  if (options.returnOldItem) emulateReturnValuesOnConditionCheckFailure();
  const server: Server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  // The SDK keeps sockets open without an idle limit; at Node's 5 s default the server may close one just as a
  // request goes out on it (ECONNRESET, not retried at maxAttempts 1).
  server.keepAliveTimeout = 60_000;
  const port = await freePort();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve());
  });
  const endpoint = `http://127.0.0.1:${port}`;
  const clients: DynamoDBClient[] = [];
  const client = () => {
    const c = new DynamoDBClient({ endpoint, region: REGION, credentials: CREDENTIALS, maxAttempts: 1 });
    clients.push(c);
    return c;
  };
  let admin: DynamoDBClient | undefined;
  return {
    endpoint,
    client,
    countItems: async (tableName, prefix) => {
      admin ??= client();
      let count = 0;
      let start: Record<string, AttributeValue> | undefined;
      do {
        const page = await admin.send(
          new ScanCommand({
            TableName: tableName,
            FilterExpression: 'begins_with(pk, :prefix)',
            ExpressionAttributeValues: { ':prefix': { S: prefix } },
            ProjectionExpression: 'pk',
            ExclusiveStartKey: start,
          }),
        );
        count += page.Count ?? 0;
        start = page.LastEvaluatedKey;
      } while (start !== undefined);
      return count;
    },
    stop: async () => {
      for (const c of clients) c.destroy();
      await new Promise<void>((resolve, reject) =>
        server.close((error) => (error ? reject(error) : resolve())),
      );
    },
  };
}

interface DynaliteDb {
  checkConditional(
    data: Record<string, unknown>,
    existing: unknown,
  ): { body: Record<string, unknown> } | null | undefined;
  oncelyPatched?: boolean;
}

/**
 * dynalite 4 ignores `ReturnValuesOnConditionCheckFailure` (it drops parameters it does not know) and returns no
 * item with a ConditionalCheckFailedException. DynamoDB returns the item as it was when the condition was
 * evaluated, in the exception's `Item`. This patch does exactly that, inside dynalite's per-item lock, so the
 * answer is as atomic as DynamoDB's: the parameter is declared for the three writes, and a failed condition puts
 * the existing item in the error body, which the SDK parses as on AWS. Jest gives each test file its own module
 * registry, so the patch only affects the file that asks for it.
 */
function emulateReturnValuesOnConditionCheckFailure(): void {
  const db = require('dynalite/db') as DynaliteDb;
  if (db.oncelyPatched) return;
  db.oncelyPatched = true;
  for (const operation of ['putItem', 'updateItem', 'deleteItem']) {
    const validation = require(`dynalite/validations/${operation}`) as { types: Record<string, unknown> };
    validation.types.ReturnValuesOnConditionCheckFailure = { type: 'String', enum: ['ALL_OLD', 'NONE'] };
  }
  const checkConditional = db.checkConditional;
  db.checkConditional = (data, existing) => {
    const error = checkConditional(data, existing);
    if (error && existing && data.ReturnValuesOnConditionCheckFailure === 'ALL_OLD')
      error.body.Item = existing;
    return error;
  };
}

/** Counts the commands a client sends, by name (`PutItemCommand`, ...). */
export function countCommands(client: DynamoDBClient): Map<string, number> {
  const counts = new Map<string, number>();
  client.middlewareStack.add(
    (next, context) => (args) => {
      const name = context.commandName ?? '?';
      counts.set(name, (counts.get(name) ?? 0) + 1);
      return next(args);
    },
    { step: 'initialize', name: 'oncelyCountCommands' },
  );
  return counts;
}

/**
 * A release by a server whose clock is ahead, then acquires by one whose clock is 10 s behind: the released state,
 * not the release time, makes the key free. `store` runs both servers; `Date.now` is the server's clock.
 */
export function releasedUnderClockSkew(store: () => DynamoDBStore): void {
  const lease = (fingerprint: string) => ({ fingerprint, lockTimeoutMs: 30_000 });
  const behind = () => {
    const real = Date.now.bind(Date);
    jest.spyOn(Date, 'now').mockImplementation(() => real() - 10_000);
  };
  describe('a record released by a server whose clock is ahead, acquired on one 10 s behind', () => {
    afterEach(() => jest.restoreAllMocks());

    test('without steps: absent to get, and of 20 concurrent acquires exactly one takes it', async () => {
      const s = store();
      const first = await s.acquire('skew-plain', lease('fp'));
      if (first.status !== 'acquired') throw new Error(`expected acquired, got ${first.status}`);
      expect(await s.release('skew-plain', first.token)).toBe(true);
      behind();
      expect(await s.get('skew-plain')).toBeUndefined();
      const results = await Promise.all(
        Array.from({ length: 20 }, () => s.acquire('skew-plain', lease('fp'))),
      );
      const taken = results.filter((r) => r.status === 'acquired');
      expect(taken).toHaveLength(1);
      expect(results.filter((r) => r.status === 'in_progress')).toHaveLength(19);
      expect(taken[0]).not.toHaveProperty('steps');
      expect(await s.renew('skew-plain', first.token, 30_000)).toBe(false);
    });

    test('with steps: get shows it released, and acquire resumes it with its steps and fingerprint', async () => {
      const s = store();
      const first = await s.acquire('skew-steps', lease('fp-1'));
      if (first.status !== 'acquired') throw new Error(`expected acquired, got ${first.status}`);
      expect(await s.recordStep('skew-steps', first.token, 'charge', '{"id":"ch_1"}', 60_000)).toBe(true);
      expect(await s.release('skew-steps', first.token)).toBe(true);
      behind();
      expect(await s.get('skew-steps')).toMatchObject({
        state: 'released',
        steps: { charge: '{"id":"ch_1"}' },
      });
      const resumed = await s.acquire('skew-steps', lease('fp-2'));
      expect(resumed).toMatchObject({
        status: 'acquired',
        steps: { charge: '{"id":"ch_1"}' },
        fingerprint: 'fp-1',
      });
      if (resumed.status !== 'acquired') return;
      expect(await s.recordStep('skew-steps', resumed.token, 'email', '', 60_000)).toBe(true);
      expect((await s.get('skew-steps'))?.steps).toEqual({ charge: '{"id":"ch_1"}', email: '' });
    });
  });
}
