import { randomUUID } from 'node:crypto';
import {
  BatchGetItemCommand,
  BatchWriteItemCommand,
  CreateTableCommand,
  DeleteItemCommand,
  DescribeTableCommand,
  DescribeTimeToLiveCommand,
  type DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  UpdateItemCommand,
  UpdateTimeToLiveCommand,
  type WriteRequest,
} from '@aws-sdk/client-dynamodb';
import type { AcquireResult, IdempotencyStore, StoredResponse } from '@oncely/core';
import {
  IdempotencyOptionsError,
  IdempotencySetupError,
  StoreOperationError,
  ValueOutOfRangeError,
} from '@oncely/core';
import { type AcquireOptions, type IdempotencyRecord, OMITTED_BODY_HEADER } from '@oncely/core/adapter';
import {
  ATTR,
  completedItemBytes,
  type Item,
  MAX_CHUNKS,
  MAX_ITEM_BYTES,
  MAX_KEY_BYTES,
  n,
  type ParsedRecord,
  parseItem,
  RESERVED_ATTRIBUTES,
  s,
  seconds,
  split,
} from './items';

export interface DynamoDBStoreOptions {
  /**
   * A low-level `DynamoDBClient` from `@aws-sdk/client-dynamodb` (v3.363 or later), yours to configure and
   * destroy. For outages to fail fast, give it `requestHandler: { requestTimeout, connectionTimeout }` and a small
   * `maxAttempts` (see docs/stores/dynamodb.md).
   */
  client: DynamoDBClient;
  /** The table of the records: partition key only, string type (`createTable()` makes one). Required. */
  tableName: string;
  /** Prepended to every key; lets several apps share one table. Default: `'oncely:'`. */
  prefix?: string;
  /** Name of the table's partition key attribute (type S). Default: `'pk'`. */
  partitionKey?: string;
  /** Name of the attribute DynamoDB's TTL deletion reads (epoch seconds). Default: `'ttl'`. */
  ttlAttribute?: string;
  /**
   * A response too large for one item (400 KB with its headers and key): `'chunk'` splits its body over extra
   * items of ~384 KiB, written before the record completes, up to 25 of them (~9.4 MiB); `'omit'` stores it
   * without its body, as executed, and its replay is a 410 (as for `maxBodyBytes`). Default: `'chunk'`.
   */
  largeBodies?: 'chunk' | 'omit';
}

/** What `createTable()` did. */
export interface CreateTableResult {
  /** `false` when the table was already there (with the right key). */
  created: boolean;
  /**
   * `'enabled'`: TTL deletion is on for `ttlAttribute` (now or already). `'unsupported'`: the endpoint does not
   * implement `UpdateTimeToLive` (an emulator such as dynalite; never DynamoDB itself): expired records stay in the
   * table, still treated as absent.
   */
  timeToLive: 'enabled' | 'unsupported';
}

type LargeBodies = 'chunk' | 'omit';

const TABLE_NAME = /^[A-Za-z0-9_.-]{3,255}$/;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function fail(option: string, message: string): never {
  throw new IdempotencyOptionsError(option, message, 'oncely/dynamodb');
}

function attributeName(option: string, value: unknown, fallback: string): string {
  const name = value ?? fallback;
  if (typeof name !== 'string' || name.length === 0 || Buffer.byteLength(name) > 255) {
    fail(option, `must be a non-empty attribute name of at most 255 bytes; got ${JSON.stringify(name)}.`);
  }
  if (RESERVED_ATTRIBUTES.has(name)) {
    fail(option, `must not be ${JSON.stringify(name)}: the store uses that attribute itself.`);
  }
  return name;
}

/** The SDK's error for a failed ConditionExpression; `Item` is the item as it was, with ALL_OLD. */
interface ConditionFailure {
  name: 'ConditionalCheckFailedException';
  Item?: Item;
}

function isConditionFailure(error: unknown): error is ConditionFailure {
  return error instanceof Error && error.name === 'ConditionalCheckFailedException';
}

function isItemTooLarge(error: unknown): boolean {
  // DynamoDB: "Item size to update has exceeded the maximum allowed size" (UpdateItem).
  return error instanceof Error && error.name === 'ValidationException' && /item size/i.test(error.message);
}

function toBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/**
 * A store in one DynamoDB table. Each step is one conditional write: `acquire` a `PutItem` that succeeds only if
 * the key is free or its record is dead (lease over, or TTL over), `complete` / `renew` an `UpdateItem` and
 * `release` a `DeleteItem` that succeed only while the caller's token owns a live lease. A duplicate learns the
 * record from the same failed write (`ReturnValuesOnConditionCheckFailure: 'ALL_OLD'`), so a replay is one request.
 * Times are the application's clock: see docs/stores/dynamodb.md on clock skew.
 */
export class DynamoDBStore implements IdempotencyStore {
  readonly #client: DynamoDBClient;
  readonly #table: string;
  readonly #prefix: string;
  readonly #pk: string;
  readonly #ttl: string;
  readonly #largeBodies: LargeBodies;

  constructor(options: DynamoDBStoreOptions) {
    if (options === null || typeof options !== 'object') {
      throw new IdempotencyOptionsError(
        'client',
        'is required (no options were given): new DynamoDBStore({ client: new DynamoDBClient({}), tableName }).',
        'oncely/dynamodb',
      );
    }
    const client: unknown = options.client;
    if (client === undefined) {
      fail('client', 'is required: new DynamoDBStore({ client: new DynamoDBClient({}), tableName }).');
    }
    if (client === null || typeof (client as { send?: unknown }).send !== 'function') {
      fail('client', 'must be a DynamoDBClient from @aws-sdk/client-dynamodb (v3).');
    }
    if (typeof options.tableName !== 'string' || !TABLE_NAME.test(options.tableName)) {
      fail(
        'tableName',
        `is required and must be a DynamoDB table name (3-255 of A-Z a-z 0-9 _ . -); got ${JSON.stringify(options.tableName)}.`,
      );
    }
    const prefix = options.prefix ?? 'oncely:';
    if (typeof prefix !== 'string' || Buffer.byteLength(prefix) > 1024) {
      fail('prefix', 'must be a string of at most 1024 bytes.');
    }
    const partitionKey = attributeName('partitionKey', options.partitionKey, 'pk');
    const ttlAttribute = attributeName('ttlAttribute', options.ttlAttribute, 'ttl');
    if (ttlAttribute === partitionKey) fail('ttlAttribute', 'must differ from "partitionKey".');
    const largeBodies = options.largeBodies ?? 'chunk';
    if (largeBodies !== 'chunk' && largeBodies !== 'omit') {
      fail('largeBodies', `must be 'chunk' or 'omit'; got ${JSON.stringify(largeBodies)}.`);
    }
    this.#client = options.client;
    this.#table = options.tableName;
    this.#prefix = prefix;
    this.#pk = partitionKey;
    this.#ttl = ttlAttribute;
    this.#largeBodies = largeBodies;
  }

  /**
   * Creates the table if it does not exist (partition key `partitionKey`, type S, on-demand capacity), waits until
   * it is ACTIVE, and turns on TTL deletion for `ttlAttribute`. Safe to run twice. An existing table with another
   * key schema, or with TTL on another attribute, is an error.
   */
  async createTable(options: { timeoutMs?: number } = {}): Promise<CreateTableResult> {
    const deadline = Date.now() + (options.timeoutMs ?? 120_000);
    let created = true;
    try {
      await this.#client.send(
        new CreateTableCommand({
          TableName: this.#table,
          AttributeDefinitions: [{ AttributeName: this.#pk, AttributeType: 'S' }],
          KeySchema: [{ AttributeName: this.#pk, KeyType: 'HASH' }],
          BillingMode: 'PAY_PER_REQUEST',
        }),
      );
    } catch (error) {
      if (!(error instanceof Error) || error.name !== 'ResourceInUseException') throw error;
      created = false;
    }
    for (;;) {
      const { Table } = await this.#client.send(new DescribeTableCommand({ TableName: this.#table }));
      const key = Table?.KeySchema ?? [];
      const type = Table?.AttributeDefinitions?.find((d) => d.AttributeName === this.#pk)?.AttributeType;
      if (key.length !== 1 || key[0]?.AttributeName !== this.#pk || type !== 'S') {
        throw new IdempotencySetupError(
          `oncely/dynamodb: table ${this.#table} exists with key ${JSON.stringify(key)}; the store needs a partition key "${this.#pk}" of type S and no sort key (option "partitionKey").`,
        );
      }
      if (Table?.TableStatus === 'ACTIVE') break;
      if (Date.now() > deadline) {
        throw new StoreOperationError(
          `oncely/dynamodb: table ${this.#table} is still ${Table?.TableStatus} (timeoutMs)`,
        );
      }
      await sleep(250);
    }
    const { TimeToLiveDescription: ttl } = await this.#client.send(
      new DescribeTimeToLiveCommand({ TableName: this.#table }),
    );
    const status = ttl?.TimeToLiveStatus;
    if (status === 'ENABLED' || status === 'ENABLING') {
      if (ttl?.AttributeName === this.#ttl) return { created, timeToLive: 'enabled' };
      throw new IdempotencySetupError(
        `oncely/dynamodb: table ${this.#table} has TTL on attribute ${JSON.stringify(ttl?.AttributeName)}; set option "ttlAttribute" to it (a table has one TTL attribute).`,
      );
    }
    try {
      await this.#client.send(
        new UpdateTimeToLiveCommand({
          TableName: this.#table,
          TimeToLiveSpecification: { AttributeName: this.#ttl, Enabled: true },
        }),
      );
    } catch (error) {
      // Emulators without TTL (dynalite). Records carry their own expiry, so correctness does not depend on it.
      if (error instanceof Error && error.name === 'UnknownOperationException') {
        return { created, timeToLive: 'unsupported' };
      }
      throw error;
    }
    return { created, timeToLive: 'enabled' };
  }

  async acquire(key: string, { fingerprint, lockTimeoutMs }: AcquireOptions): Promise<AcquireResult> {
    const pk = this.#key(key);
    const token = randomUUID();
    // A record read after a failed write can end before we look at it (fallback read, or a chunk gone): try again.
    for (let attempt = 0; attempt < 10; attempt++) {
      const now = Date.now();
      const lease = now + lockTimeoutMs;
      let old: Item | undefined;
      try {
        await this.#client.send(
          new PutItemCommand({
            TableName: this.#table,
            Item: {
              [this.#pk]: s(pk),
              [ATTR.state]: s('in_progress'),
              [ATTR.fingerprint]: s(fingerprint),
              [ATTR.token]: s(token),
              [ATTR.lockExpiresAt]: n(lease),
              [ATTR.expiresAt]: n(lease),
              [this.#ttl]: seconds(lease),
            },
            // Free, or dead: a lease that ran out, or any record past its end (TTL deletion is lazy, up to days).
            ConditionExpression:
              'attribute_not_exists(#pk) OR (#state = :inProgress AND #lock <= :now) OR #expires <= :now',
            ExpressionAttributeNames: {
              '#pk': this.#pk,
              '#state': ATTR.state,
              '#lock': ATTR.lockExpiresAt,
              '#expires': ATTR.expiresAt,
            },
            ExpressionAttributeValues: { ':inProgress': s('in_progress'), ':now': n(now) },
            ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
          }),
        );
        return { status: 'acquired', token };
      } catch (error) {
        if (!isConditionFailure(error)) {
          // The put may still have been applied (a timeout after DynamoDB got it): release our token behind it
          // so the orphan lease does not block retries for lockTimeout. The token fences anyone else's record.
          this.release(key, token).catch(() => {});
          throw error;
        }
        old = error.Item;
      }
      // The item as it was when the condition failed, so it was live at `now`. Without it (emulators without
      // ReturnValuesOnConditionCheckFailure), a strongly consistent read, judged at the time of the read.
      let at = now;
      if (old === undefined) {
        old = await this.#read(pk);
        at = Date.now();
        if (old === undefined) continue;
      }
      const record = parseItem(old, pk);
      // Our own put, applied once already and retried by the SDK after a lost response: we hold the key.
      if (record.token === token && record.state === 'in_progress') return { status: 'acquired', token };
      if (record.expiresAt <= at) continue;
      if (record.state === 'in_progress') {
        return {
          status: 'in_progress',
          fingerprint: record.fingerprint,
          retryAfterMs: Math.max(1, record.lockExpiresAt - at),
        };
      }
      const response = await this.#response(record);
      if (response === undefined) continue;
      return { status: 'completed', fingerprint: record.fingerprint, response };
    }
    throw new StoreOperationError(
      `oncely/dynamodb: acquire for key ${JSON.stringify(key)} found no stable answer after 10 attempts`,
    );
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const pk = this.#key(key);
    const completion = randomUUID();
    const headersJson = JSON.stringify(response.headers);
    const inline =
      completedItemBytes(
        { partitionKey: this.#pk, ttlAttribute: this.#ttl },
        pk,
        token,
        completion,
        headersJson,
        response.body.byteLength,
      ) <= MAX_ITEM_BYTES;
    try {
      return await this.#complete(pk, token, completion, response, ttlMs, inline ? 'inline' : undefined);
    } catch (error) {
      // Sized with a fingerprint allowance; a longer custom fingerprint can still overflow: move the body out.
      if (!inline || !isItemTooLarge(error)) throw error;
      return this.#complete(pk, token, completion, response, ttlMs, undefined);
    }
  }

  async #complete(
    pk: string,
    token: string,
    completion: string,
    response: StoredResponse,
    ttlMs: number,
    placement: 'inline' | undefined,
  ): Promise<boolean> {
    const body = response.body;
    const pieces = placement === 'inline' ? [] : split(body);
    const how =
      placement ?? (this.#largeBodies === 'chunk' && pieces.length <= MAX_CHUNKS ? 'chunks' : 'omitted');
    const now = Date.now();
    const expiresAt = now + ttlMs;
    const headers =
      how === 'omitted' ? { ...response.headers, [OMITTED_BODY_HEADER]: '1' } : response.headers;
    const names: Record<string, string> = {
      '#state': ATTR.state,
      '#token': ATTR.token,
      '#lock': ATTR.lockExpiresAt,
      '#expires': ATTR.expiresAt,
      '#ttl': this.#ttl,
      '#status': ATTR.status,
      '#headers': ATTR.headers,
      '#completion': ATTR.completion,
    };
    const values: Item = {
      ':token': s(token),
      ':inProgress': s('in_progress'),
      ':completed': s('completed'),
      ':now': n(now),
      ':expires': n(expiresAt),
      ':ttl': seconds(expiresAt),
      ':status': n(response.status),
      ':headers': s(JSON.stringify(headers)),
      ':completion': s(completion),
    };
    const set = [
      '#state = :completed',
      '#expires = :expires',
      '#ttl = :ttl',
      '#status = :status',
      '#headers = :headers',
      '#completion = :completion',
    ];
    let chunkId: string | undefined;
    // An empty body is stored as no attribute.
    if (how === 'inline' && body.byteLength > 0) {
      names['#body'] = ATTR.body;
      values[':body'] = { B: body };
      set.push('#body = :body');
    } else if (how === 'chunks') {
      chunkId = randomUUID();
      // Chunks first, the record last: the conditional update is the commit, and until it succeeds no record
      // points at the chunks. A fenced-off owner's chunks are deleted below (or by TTL): never anyone else's,
      // since every complete call writes under a new chunk id.
      await this.#writeChunks(
        pieces.map((piece, i) => ({
          PutRequest: {
            Item: {
              [this.#pk]: s(this.#chunkKey(chunkId as string, i)),
              [ATTR.body]: { B: piece },
              [ATTR.expiresAt]: n(expiresAt),
              [this.#ttl]: seconds(expiresAt),
            },
          },
        })),
      );
      Object.assign(names, { '#chunks': ATTR.chunks, '#chunkId': ATTR.chunkId, '#bytes': ATTR.bodyBytes });
      Object.assign(values, {
        ':chunks': n(pieces.length),
        ':chunkId': s(chunkId),
        ':bytes': n(body.byteLength),
      });
      set.push('#chunks = :chunks', '#chunkId = :chunkId', '#bytes = :bytes');
    }
    try {
      await this.#client.send(
        new UpdateItemCommand({
          TableName: this.#table,
          Key: { [this.#pk]: s(pk) },
          UpdateExpression: `SET ${set.join(', ')} REMOVE #lock`,
          ConditionExpression: '#token = :token AND #state = :inProgress AND #lock > :now',
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values,
          ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
        }),
      );
      return true;
    } catch (error) {
      // Any other error leaves it unknown whether the update landed: the chunks stay (TTL removes orphans).
      if (!isConditionFailure(error)) throw error;
      // Our own update, applied once already and retried by the SDK after a lost response.
      if (error.Item?.[ATTR.completion]?.S === completion) return true;
      // Fenced off: nothing points at our chunks, remove them now rather than at their TTL.
      if (chunkId !== undefined) this.#deleteChunks(chunkId, pieces.length).catch(() => {});
      return false;
    }
  }

  async release(key: string, token: string): Promise<boolean> {
    try {
      await this.#client.send(
        new DeleteItemCommand({
          TableName: this.#table,
          Key: { [this.#pk]: s(this.#key(key)) },
          ConditionExpression: '#token = :token AND #state = :inProgress AND #lock > :now',
          ExpressionAttributeNames: {
            '#token': ATTR.token,
            '#state': ATTR.state,
            '#lock': ATTR.lockExpiresAt,
          },
          ExpressionAttributeValues: {
            ':token': s(token),
            ':inProgress': s('in_progress'),
            ':now': n(Date.now()),
          },
        }),
      );
      return true;
    } catch (error) {
      if (isConditionFailure(error)) return false;
      throw error;
    }
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    const now = Date.now();
    const lease = now + lockTimeoutMs;
    try {
      await this.#client.send(
        new UpdateItemCommand({
          TableName: this.#table,
          Key: { [this.#pk]: s(this.#key(key)) },
          UpdateExpression: 'SET #lock = :lease, #expires = :lease, #ttl = :ttl',
          ConditionExpression: '#token = :token AND #state = :inProgress AND #lock > :now',
          ExpressionAttributeNames: {
            '#token': ATTR.token,
            '#state': ATTR.state,
            '#lock': ATTR.lockExpiresAt,
            '#expires': ATTR.expiresAt,
            '#ttl': this.#ttl,
          },
          ExpressionAttributeValues: {
            ':token': s(token),
            ':inProgress': s('in_progress'),
            ':now': n(now),
            ':lease': n(lease),
            ':ttl': seconds(lease),
          },
        }),
      );
      return true;
    } catch (error) {
      if (isConditionFailure(error)) return false;
      throw error;
    }
  }

  /** The live record under `key` (strongly consistent read); an item past its end counts as absent. */
  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const pk = this.#key(key);
    for (let attempt = 0; attempt < 10; attempt++) {
      const item = await this.#read(pk);
      if (item === undefined) return undefined;
      const parsed = parseItem(item, pk);
      if (parsed.expiresAt <= Date.now()) return undefined;
      const record: IdempotencyRecord = {
        state: parsed.state,
        fingerprint: parsed.fingerprint,
        token: parsed.token,
        lockExpiresAt: parsed.lockExpiresAt,
        expiresAt: parsed.expiresAt,
      };
      if (parsed.state === 'in_progress') return record;
      const response = await this.#response(parsed);
      // A chunk vanished: the record was deleted or replaced meanwhile; read it again.
      if (response === undefined) continue;
      record.response = response;
      return record;
    }
    throw new StoreOperationError(
      `oncely/dynamodb: get for key ${JSON.stringify(key)} found no stable answer`,
    );
  }

  /** Removes the record under `key` whatever its state, and its chunk items. Resolves `true` if one was live. */
  async delete(key: string): Promise<boolean> {
    const { Attributes } = await this.#client.send(
      new DeleteItemCommand({
        TableName: this.#table,
        Key: { [this.#pk]: s(this.#key(key)) },
        ReturnValues: 'ALL_OLD',
      }),
    );
    if (Attributes === undefined) return false;
    const record = parseItem(Attributes, this.#key(key));
    if (record.chunks !== undefined) await this.#deleteChunks(record.chunks.id, record.chunks.count);
    return record.expiresAt > Date.now();
  }

  #key(key: string): string {
    const pk = this.#prefix + key;
    if (Buffer.byteLength(pk) > MAX_KEY_BYTES) {
      throw new ValueOutOfRangeError(
        `oncely/dynamodb: key ${JSON.stringify(key.slice(0, 64))}... is longer than DynamoDB's 2048-byte partition key (with the prefix)`,
      );
    }
    return pk;
  }

  /**
   * Chunk items live under `<prefix>chunk:<chunk id>:<n>`, the chunk id a random UUID per complete call: a record
   * key can only meet one by guessing that UUID.
   */
  #chunkKey(id: string, index: number): string {
    return `${this.#prefix}chunk:${id}:${index}`;
  }

  async #read(pk: string): Promise<Item | undefined> {
    const { Item } = await this.#client.send(
      new GetItemCommand({ TableName: this.#table, Key: { [this.#pk]: s(pk) }, ConsistentRead: true }),
    );
    return Item;
  }

  /** The stored response, reading chunk items if the body is in them; `undefined` if one is gone. */
  async #response(record: ParsedRecord): Promise<StoredResponse | undefined> {
    const stored = record.response;
    if (stored === undefined) return undefined;
    if (record.chunks === undefined) return { ...stored, body: stored.body ?? new Uint8Array(0) };
    const { id, count, bytes } = record.chunks;
    const keys = Array.from({ length: count }, (_, i) => ({ [this.#pk]: s(this.#chunkKey(id, i)) }));
    const found = new Map<string, Uint8Array>();
    let pending = keys;
    for (let attempt = 0; pending.length > 0; attempt++) {
      if (attempt > 0) await this.#backoff(attempt, 'BatchGetItem');
      const { Responses, UnprocessedKeys } = await this.#client.send(
        new BatchGetItemCommand({
          RequestItems: { [this.#table]: { Keys: pending, ConsistentRead: true } },
        }),
      );
      for (const item of Responses?.[this.#table] ?? []) {
        const pk = item[this.#pk]?.S;
        const body = item[ATTR.body]?.B;
        if (pk !== undefined && body !== undefined) found.set(pk, body);
      }
      pending = UnprocessedKeys?.[this.#table]?.Keys ?? [];
    }
    const body = Buffer.alloc(bytes);
    let offset = 0;
    for (let i = 0; i < count; i++) {
      const piece = found.get(this.#chunkKey(id, i));
      if (piece === undefined) return undefined;
      toBuffer(piece).copy(body, offset);
      offset += piece.byteLength;
    }
    if (offset !== bytes) return undefined;
    return { status: stored.status, headers: stored.headers, body };
  }

  async #writeChunks(requests: WriteRequest[]): Promise<void> {
    let pending = requests;
    for (let attempt = 0; pending.length > 0; attempt++) {
      if (attempt > 0) await this.#backoff(attempt, 'BatchWriteItem');
      const { UnprocessedItems } = await this.#client.send(
        new BatchWriteItemCommand({ RequestItems: { [this.#table]: pending } }),
      );
      pending = UnprocessedItems?.[this.#table] ?? [];
    }
  }

  #deleteChunks(id: string, count: number): Promise<void> {
    return this.#writeChunks(
      Array.from({ length: count }, (_, i) => ({
        DeleteRequest: { Key: { [this.#pk]: s(this.#chunkKey(id, i)) } },
      })),
    );
  }

  /** Unprocessed batch entries (throttling, or a response over 16 MB): back off and send them again, 8 times. */
  async #backoff(attempt: number, operation: string): Promise<void> {
    if (attempt > 8) {
      throw new StoreOperationError(
        `oncely/dynamodb: ${operation} left items unprocessed after ${attempt} attempts`,
      );
    }
    await sleep(Math.min(1000, 25 * 2 ** attempt));
  }
}
