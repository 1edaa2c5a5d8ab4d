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
import type { AcquiredResult, AcquireResult, IdempotencyStore, StoredResponse } from '@oncely/core';
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
  recordOf,
  s,
  seconds,
  split,
  stateAt,
} from './items';
import { chunkKeyOf, DEFAULT_PARTITION_KEY, DEFAULT_PREFIX, DEFAULT_TTL_ATTRIBUTE } from './records';

/** Options of {@link DynamoDBStore}: the client, the table and its attribute names, and how large bodies are kept. */
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

/** A new record's empty steps map: recordStep sets one entry of it (`steps.#name`), which needs the map. */
const NO_STEPS = { M: {} };
/** A record over: past its lease or TTL end and, if it carries steps, past their keep-until. */
/** The token owns a live lease. */
const OWNED = '#token = :token AND #state = :inProgress AND #lock > :now';
const DEAD = '(#expires <= :now AND (attribute_not_exists(#keep) OR #keep <= :now))';

/** `acquired`, with the steps and kept fingerprint of a resumed record (as written: the acquire's new item). */
function acquired(token: string, record: ParsedRecord | undefined): AcquiredResult {
  if (record?.steps === undefined) return { status: 'acquired', token };
  return { status: 'acquired', token, steps: record.steps, fingerprint: record.fingerprint };
}

function toBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/**
 * A store in one DynamoDB table. Each operation is one conditional write: `acquire` an `UpdateItem` that succeeds
 * only if the key is free, its record is dead (lease over, or TTL over) or released (one with steps it resumes),
 * and `complete` / `renew` / `release` / `recordStep` `UpdateItem`s that succeed only while the caller's token owns a
 * live lease. A duplicate learns the record from the same failed write (`ReturnValuesOnConditionCheckFailure:
 * 'ALL_OLD'`), so a replay is one request.
 * Times are the application's clock: see docs/stores/dynamodb.md on clock skew.
 */
export class DynamoDBStore implements IdempotencyStore {
  readonly #client: DynamoDBClient;
  readonly #table: string;
  readonly #prefix: string;
  readonly #pk: string;
  readonly #ttl: string;
  readonly #largeBodies: LargeBodies;

  /**
   * Makes a store on `options.client`, which stays yours to destroy. `createTable()` makes its table if you have
   * none. Throws `IdempotencyOptionsError` when an option is missing or wrong.
   */
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
    const prefix = options.prefix ?? DEFAULT_PREFIX;
    if (typeof prefix !== 'string' || Buffer.byteLength(prefix) > 1024) {
      fail('prefix', 'must be a string of at most 1024 bytes.');
    }
    const partitionKey = attributeName('partitionKey', options.partitionKey, DEFAULT_PARTITION_KEY);
    const ttlAttribute = attributeName('ttlAttribute', options.ttlAttribute, DEFAULT_TTL_ATTRIBUTE);
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
    // The usual write is an UpdateItem, which takes a free key and resumes a released record alike; a dead record
    // that still carries steps must lose them, which only a PutItem (replacing the item) can do.
    let replace = false;
    // A record read after a failed write can end before we look at it (fallback read, or a chunk gone): try again.
    for (let attempt = 0; attempt < 10; attempt++) {
      const now = Date.now();
      const lease = now + lockTimeoutMs;
      let old: Item | undefined;
      try {
        if (replace) {
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
                [ATTR.steps]: NO_STEPS,
              },
              ConditionExpression: `attribute_not_exists(#pk) OR ${DEAD}`,
              ExpressionAttributeNames: {
                '#pk': this.#pk,
                '#expires': ATTR.expiresAt,
                '#keep': ATTR.stepsUntil,
              },
              ExpressionAttributeValues: { ':now': n(now) },
              ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
            }),
          );
          return { status: 'acquired', token };
        }
        const { Attributes } = await this.#client.send(
          new UpdateItemCommand({
            TableName: this.#table,
            Key: { [this.#pk]: s(pk) },
            // A resumed record keeps its steps' fingerprint, steps and stepsUntil; a fresh one never had them. The
            // TTL attribute covers the lease and, with steps, their keep-until (at most stepsTtl after now).
            UpdateExpression:
              'SET #state = :inProgress, #token = :token, #fingerprint = if_not_exists(#stepsFingerprint, :fingerprint), ' +
              '#lock = :lease, #expires = :lease, #ttl = :leaseSeconds + if_not_exists(#stepsTtl, :zero), ' +
              '#steps = if_not_exists(#steps, :noSteps) ' +
              'REMOVE #status, #headers, #body, #chunks, #chunkId, #bytes, #completion',
            // Free: no item; without steps, a released record, one past its end or a lease that ran out; with
            // steps, a record nobody holds (released or lease over) not yet over. `released` is free whatever
            // this server's clock says: the releaser's clock, which set its times, may run ahead of ours.
            ConditionExpression:
              'attribute_not_exists(#pk) OR (attribute_not_exists(#keep) AND (#state = :released OR ' +
              '#expires <= :now OR (#state = :inProgress AND #lock <= :now))) OR (attribute_exists(#keep) AND ' +
              '(#keep > :now OR #expires > :now) AND (#state = :released OR #lock <= :now))',
            ExpressionAttributeNames: {
              '#pk': this.#pk,
              '#state': ATTR.state,
              '#token': ATTR.token,
              '#fingerprint': ATTR.fingerprint,
              '#stepsFingerprint': ATTR.stepsFingerprint,
              '#lock': ATTR.lockExpiresAt,
              '#expires': ATTR.expiresAt,
              '#ttl': this.#ttl,
              '#stepsTtl': ATTR.stepsTtl,
              '#steps': ATTR.steps,
              '#keep': ATTR.stepsUntil,
              '#status': ATTR.status,
              '#headers': ATTR.headers,
              '#body': ATTR.body,
              '#chunks': ATTR.chunks,
              '#chunkId': ATTR.chunkId,
              '#bytes': ATTR.bodyBytes,
              '#completion': ATTR.completion,
            },
            ExpressionAttributeValues: {
              ':inProgress': s('in_progress'),
              ':released': s('released'),
              ':token': s(token),
              ':fingerprint': s(fingerprint),
              ':lease': n(lease),
              ':leaseSeconds': seconds(lease),
              ':zero': n(0),
              ':noSteps': NO_STEPS,
              ':now': n(now),
            },
            ReturnValues: 'ALL_NEW',
            ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
          }),
        );
        return acquired(token, Attributes === undefined ? undefined : parseItem(Attributes, pk));
      } catch (error) {
        if (!isConditionFailure(error)) {
          // The write may still have been applied (a timeout after DynamoDB got it): release our token behind it
          // so the orphan lease does not block retries for lockTimeout. The token fences anyone else's record.
          this.release(key, token).catch(() => {});
          throw error;
        }
        old = error.Item;
      }
      // The item as it was when the condition failed, so it was live at `now` (or dead with steps). Without it
      // (emulators without ReturnValuesOnConditionCheckFailure), a strongly consistent read, judged at its time.
      let at = now;
      if (old === undefined) {
        old = await this.#read(pk);
        at = Date.now();
        if (old === undefined) continue;
      }
      const record = parseItem(old, pk);
      // Our own write, applied once already and retried by the SDK after a lost response: we hold the key.
      if (record.token === token && record.state === 'in_progress') return acquired(token, record);
      const state = stateAt(record, at);
      // The next write is the one that can take the record as judged (the UpdateItem's condition and `stateAt`
      // agree): a PutItem only for a dead record with steps, so a retry never repeats a write that cannot succeed.
      replace = state === undefined && record.stepsUntil !== undefined;
      if (state === undefined || state === 'released') continue;
      if (state === 'in_progress') {
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
      '#steps': ATTR.steps,
      '#keep': ATTR.stepsUntil,
      '#stepsTtl': ATTR.stepsTtl,
      '#stepsFingerprint': ATTR.stepsFingerprint,
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
          // A completed record holds only its response: its steps go in the same write.
          UpdateExpression: `SET ${set.join(', ')} REMOVE #lock, #steps, #keep, #stepsTtl, #stepsFingerprint`,
          ConditionExpression: OWNED,
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

  /**
   * Ends the lease in one conditional `UpdateItem`: the record is `released` with its lease end now, so a record
   * without steps is over at once (DynamoDB's TTL deletion removes the item) and one with steps is kept until its
   * `stepsUntil`, for the next acquire to resume.
   */
  async release(key: string, token: string): Promise<boolean> {
    const now = Date.now();
    try {
      await this.#client.send(
        new UpdateItemCommand({
          TableName: this.#table,
          Key: { [this.#pk]: s(this.#key(key)) },
          UpdateExpression:
            'SET #state = :released, #lock = :now, #expires = :now, #ttl = :nowSeconds + if_not_exists(#stepsTtl, :zero)',
          ConditionExpression: OWNED,
          ExpressionAttributeNames: {
            '#token': ATTR.token,
            '#state': ATTR.state,
            '#lock': ATTR.lockExpiresAt,
            '#expires': ATTR.expiresAt,
            '#ttl': this.#ttl,
            '#stepsTtl': ATTR.stepsTtl,
          },
          ExpressionAttributeValues: {
            ':token': s(token),
            ':inProgress': s('in_progress'),
            ':released': s('released'),
            ':now': n(now),
            ':nowSeconds': seconds(now),
            ':zero': n(0),
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
          // With steps, the TTL attribute also covers their keep-until, which is at most stepsTtl after now.
          UpdateExpression:
            'SET #lock = :lease, #expires = :lease, #ttl = :ttl + if_not_exists(#stepsTtl, :zero)',
          ConditionExpression: OWNED,
          ExpressionAttributeNames: {
            '#token': ATTR.token,
            '#state': ATTR.state,
            '#lock': ATTR.lockExpiresAt,
            '#expires': ATTR.expiresAt,
            '#ttl': this.#ttl,
            '#stepsTtl': ATTR.stepsTtl,
          },
          ExpressionAttributeValues: {
            ':token': s(token),
            ':inProgress': s('in_progress'),
            ':now': n(now),
            ':lease': n(lease),
            ':ttl': seconds(lease),
            ':zero': n(0),
          },
        }),
      );
      return true;
    } catch (error) {
      if (isConditionFailure(error)) return false;
      throw error;
    }
  }

  /**
   * One conditional `UpdateItem`: the step as one entry of the record's `steps` map (its name an expression
   * attribute name, so any string is safe), `stepsUntil` moved to `ttlMs` from now, and the TTL attribute with
   * it. The condition is that the token owns a live lease that ends no later than the new `stepsUntil` (so the TTL
   * attribute can be set to it); a longer lease (a lockTimeout above the ttl) costs a second write.
   */
  async recordStep(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean> {
    const pk = this.#key(key);
    let lease: number | undefined;
    for (let attempt = 0; attempt < 10; attempt++) {
      const now = Date.now();
      const keep = now + ttlMs;
      try {
        await this.#client.send(
          new UpdateItemCommand({
            TableName: this.#table,
            Key: { [this.#pk]: s(pk) },
            UpdateExpression:
              'SET #steps.#name = :value, #keep = :keep, #stepsTtl = :stepsTtl, ' +
              '#stepsFingerprint = #fingerprint, #ttl = :ttl',
            ConditionExpression: `${OWNED} AND ${lease === undefined ? '#lock <= :keep' : '#lock = :lease'}`,
            ExpressionAttributeNames: {
              '#token': ATTR.token,
              '#state': ATTR.state,
              '#lock': ATTR.lockExpiresAt,
              '#steps': ATTR.steps,
              '#name': name,
              '#keep': ATTR.stepsUntil,
              '#stepsTtl': ATTR.stepsTtl,
              '#stepsFingerprint': ATTR.stepsFingerprint,
              '#fingerprint': ATTR.fingerprint,
              '#ttl': this.#ttl,
            },
            ExpressionAttributeValues: {
              ':token': s(token),
              ':inProgress': s('in_progress'),
              ':now': n(now),
              ':value': s(value),
              ':keep': n(keep),
              ':stepsTtl': n(Math.ceil(ttlMs / 1000)),
              ':ttl': seconds(Math.max(keep, lease ?? 0)),
              ...(lease === undefined ? {} : { ':lease': n(lease) }),
            },
            ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
          }),
        );
        return true;
      } catch (error) {
        if (isItemTooLarge(error)) {
          throw new StoreOperationError(
            `oncely/dynamodb: step ${JSON.stringify(name)} of key ${JSON.stringify(key)} does not fit in the record's DynamoDB item (400 KB for all its steps, key and attributes): nothing was recorded; return less from the step (store large results elsewhere and return a reference)`,
            { cause: error },
          );
        }
        if (!isConditionFailure(error)) throw error;
        let old = error.Item;
        let at = now;
        if (old === undefined) {
          old = await this.#read(pk);
          at = Date.now();
          if (old === undefined) return false;
        }
        const record = parseItem(old, pk);
        if (record.token !== token || record.state !== 'in_progress' || record.lockExpiresAt <= at)
          return false;
        // Still ours: the lease ends after the new stepsUntil, or was renewed meanwhile. Cover that lease end.
        lease = record.lockExpiresAt;
      }
    }
    throw new StoreOperationError(
      `oncely/dynamodb: recordStep for key ${JSON.stringify(key)} found no stable answer after 10 attempts`,
    );
  }

  /**
   * The live record under `key` (strongly consistent read); an item past its end counts as absent. A record that
   * carries steps and that nobody holds is `released`.
   */
  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const pk = this.#key(key);
    for (let attempt = 0; attempt < 10; attempt++) {
      const item = await this.#read(pk);
      if (item === undefined) return undefined;
      const parsed = parseItem(item, pk);
      const state = stateAt(parsed, Date.now());
      if (state === undefined) return undefined;
      const record = recordOf(parsed, state);
      if (state !== 'completed') return record;
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
    return stateAt(record, Date.now()) !== undefined;
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

  /** A chunk item's partition key (`chunkKeyOf`, shared with `@oncely/dynamodb/records`). */
  #chunkKey(id: string, index: number): string {
    return chunkKeyOf(this.#prefix, id, index);
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
