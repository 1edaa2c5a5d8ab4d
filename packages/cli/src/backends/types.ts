import type { IdempotencyRecord } from '@oncely/core/adapter';

/**
 * What every store backend of the command gives: the commands (inspect, delete, list, stats) are written once
 * against this, and a backend only reads and deletes its store's records. A backend finds a record by its store
 * key, the key the engine hands the store: the client's key, or `<scope> <key>` when the app sets a scope
 * (`storeKeyOf`). The store's prefix, hash tags or table come from the backend's own options.
 */
export interface Backend {
  /** What the command says it is connected to, without credentials: `redis 127.0.0.1:6379 prefix "oncely:"`. */
  readonly description: string;
  /** The live record under the store key, or undefined; an expired record is absent, as the store sees it. */
  inspect(storeKey: string): Promise<RecordView | undefined>;
  /** Removes the record (whatever its state); resolves true if a live one was there. */
  delete(storeKey: string): Promise<boolean>;
  /** One page of records, without blocking the store (SCAN, keyset pagination, Scan with a limit). */
  list(options: ListOptions): Promise<ListPage>;
  /** Every record counted by state, with the bytes they take where the store can tell. */
  stats(onProgress?: (scanned: number) => void): Promise<Stats>;
  /** Closes the connections the backend opened. */
  close(): Promise<void>;
}

/**
 * A record's state: `in_progress` while an execution holds its lease, `completed` once its response is stored,
 * `released` when the execution failed or its lease ran out (the next request with the key runs again).
 */
export type RecordState = 'in_progress' | 'completed' | 'released';

/** A record as a person reads it. */
export interface RecordView {
  /** The client's key (the `Idempotency-Key` header). */
  key: string;
  /** The scope the app gave, or undefined for an unscoped record. */
  scope: string | undefined;
  /** The key the engine hands the store (`storeKeyOf`). */
  storeKey: string;
  /** Where the record is in the store: the Redis key, the partition key, the row's key. */
  location: string;
  /** Its state as the store judges it now. */
  state: RecordState;
  /** In progress: how long the owner's lease has left. */
  leaseLeftMs?: number;
  /** The owner's fencing token (in progress and released records only). */
  owner?: string;
  /** The request fingerprint the record was made with as stored, when it has one. */
  fingerprint?: string;
  /** When the record was made, where the store keeps it. */
  createdAt?: Date;
  /** When the store forgets it (lease end, TTL end, or its steps' end). */
  expiresAt?: Date;
  /** The steps the execution recorded (`req.idempotency.step`), in the order the store keeps them. */
  steps?: StepView[];
  /** Completed: the stored response. */
  response?: ResponseView;
  /** The bytes the record takes in the store, where it can tell (Redis MEMORY USAGE, the item's size). */
  bytes?: number;
}

/** A step an execution recorded, as a person reads it. */
export interface StepView {
  /** The step's name, as given to `req.idempotency.step`. */
  name: string;
  /** The step's result as stored (the engine's encoding of it), cut to a preview. */
  preview: string;
  /** The stored result's whole size, in bytes. */
  bytes: number;
}

/** A completed record's stored response, as a person reads it. */
export interface ResponseView {
  /** The HTTP status replayed. */
  status: number;
  /** The headers replayed, by name. */
  headers: Record<string, string | string[]>;
  /** The body's start, as UTF-8 text when it is text, else base64 (`bodyEncoding`). */
  bodyPreview: string;
  /** How `bodyPreview` is written: UTF-8 text, or base64 for a body that is not text. */
  bodyEncoding: 'utf8' | 'base64';
  /** The whole body's size, in bytes. */
  bodyBytes: number;
}

/** What `list` shows: a filter, and where the page starts. */
export interface ListOptions {
  /** Only records whose lease is held now. */
  inProgress?: boolean;
  /** Only records of this scope. */
  scope?: string;
  /** At most this many records in the page (a backend may return fewer, and a cursor). */
  limit: number;
  /** Where the previous page ended (its `cursor`). */
  cursor?: string;
}

/** One page of `list`. */
export interface ListPage {
  /** The page's records, in the order the store returned them. */
  records: RecordView[];
  /** Keys or items in this page that are not records of a layout this version knows, by location. */
  unknown?: string[];
  /** Set when there may be more: pass it as `cursor` for the next page. */
  cursor?: string;
}

/** What `stats` counts over the whole store. */
export interface Stats {
  /** Records by state. */
  byState: Record<RecordState, number>;
  /** Live records counted (`byState` summed). */
  records: number;
  /** Keys or items under the prefix that are not records of a layout this version knows (left out of the rest). */
  unknown: number;
  /** The bytes the records take, where the store can tell (summed or estimated from a sample: `bytesSampled`). */
  bytes?: number;
  /** How many records' sizes were measured when `bytes` is estimated from a sample. */
  bytesSampled?: number;
}

/** How to reach the store: from `--url` and the other options, or the environment. */
export interface ConnectOptions {
  /** The store's URL: its scheme picks the backend (`redis:`, `redis-cluster:`, `postgres:`, `mysql:`, `dynamodb:` and their aliases). */
  url: URL;
  /** Redis Cluster: seed nodes (`--node`, repeatable), or `--cluster` with the URL's host as the seed. */
  nodes: string[];
  /** Whether the store is a Redis Cluster (`--cluster`, `--node`, or a `redis-cluster:` URL). */
  cluster: boolean;
  /** The store's key prefix; undefined: the store's default. */
  prefix: string | undefined;
  /** The SQL table, where the store takes one; undefined: the store's default. */
  table: string | undefined;
  /** How long to wait for the store to answer before exiting 3. */
  connectTimeoutMs: number;
  /** The environment (credentials such as PGPASSWORD or AWS_ACCESS_KEY_ID, a region). */
  env: Record<string, string | undefined>;
}

/** Opens a backend; rejects with a `CliError` (unreachable, missing driver) when it cannot. */
export type BackendFactory = (options: ConnectOptions) => Promise<Backend>;

/** A store record as decoded by its store, to view (`recordView`). */
export type StoredRecord = IdempotencyRecord;
