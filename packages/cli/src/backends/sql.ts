import type { IdempotencyRecord } from '@oncely/core/adapter';
import { CliError, EXIT, isCliError, unreachable, usageError } from '../errors';
import { inScope, noRecords, PREVIEW_BYTES, recordView } from '../records';
import type { Backend, ListOptions, ListPage, RecordView, Stats } from './types';

/** How a SQL store lays out its records (`@oncely/postgres/records`, `@oncely/mysql/records`). */
export interface SqlLayout {
  table: string;
  key: string;
  live: string;
  state: string;
  columns(options?: { bodyBytes?: number }): string;
}

/** A row read with the layout's columns, decoded by the store's own decoder. */
export interface SqlDecoded {
  key: string;
  record: IdempotencyRecord;
  createdAt: number;
  bodyBytes: number;
  rowBytes?: number;
  now: number;
}

/** What differs between PostgreSQL and MySQL: the driver, placeholders, how keys travel, the table's size. */
export interface SqlDialect {
  /** The server and database the command is connected to, without credentials: `postgres host:5432/db`. */
  where: string;
  layout: SqlLayout;
  decode(row: Record<string, unknown>): SqlDecoded;
  /** Runs one statement; `?` placeholders are numbered by `placeholder` first. */
  query(statement: string, params: readonly unknown[]): Promise<Record<string, unknown>[]>;
  /** The n-th (1-based) placeholder. */
  placeholder(n: number): string;
  /** A store key as a statement parameter. */
  keyParam(key: string): unknown;
  /** A key column's value (or the max of it) as the store key. */
  keyText(value: unknown): string;
  /** DELETE by key; true if a live record was there. */
  deleteKey(key: string): Promise<boolean>;
  /** The bytes the table takes, as the server reports it. */
  tableBytes(): Promise<number | undefined>;
  /** What a driver error says is missing: the table (or its schema), a column of the layout, or neither. */
  missing(error: unknown): 'table' | 'column' | undefined;
  close(): Promise<void>;
}

/** Rows a page's window walks through the primary key at most, whatever its filters: one bounded query. */
const MAX_WINDOW = 5000;
const MIN_WINDOW = 500;
/** Records one page shows at most. */
export const MAX_PAGE = 1000;
/** Rows one stats query counts. */
const STATS_BATCH = 5000;

/** A cursor: the last key a page went through, base64url, opaque to the user. */
export function encodeCursor(key: string): string {
  return Buffer.from(key, 'utf8').toString('base64url');
}

export function decodeCursor(cursor: string): string {
  const key = Buffer.from(cursor, 'base64url').toString('utf8');
  if (cursor === '' || encodeCursor(key) !== cursor) {
    throw usageError(
      '--cursor is not a cursor this store printed (pass the cursor of the previous page as is)',
    );
  }
  return key;
}

function truthy(value: unknown): boolean {
  return value === true || value === 't' || Number(value) === 1;
}

/**
 * A backend for a SQL store, the same for PostgreSQL and MySQL: records are read with the store's own layout and
 * decoder; list is keyset pagination on the primary key (a bounded window of keys per page, never OFFSET, no
 * lock held past one statement); stats counts by state in bounded batches of the same walk.
 */
export class SqlBackend implements Backend {
  readonly description: string;
  readonly #dialect: SqlDialect;
  readonly #layout: SqlLayout;

  constructor(dialect: SqlDialect) {
    this.#dialect = dialect;
    this.#layout = dialect.layout;
    this.description = `${dialect.where} table ${dialect.layout.table}`;
  }

  /**
   * The backend on `dialect`, once a statement that reads no row has shown the table and the layout's columns are
   * there (closing the connection if not).
   */
  static async open(dialect: SqlDialect): Promise<SqlBackend> {
    const backend = new SqlBackend(dialect);
    const { table, state } = dialect.layout;
    try {
      await backend.#query(`SELECT ${dialect.layout.columns()}, ${state} AS s FROM ${table} LIMIT 0`, []);
    } catch (error) {
      await dialect.close();
      throw error;
    }
    return backend;
  }

  async inspect(storeKey: string): Promise<RecordView | undefined> {
    const { table, key, live } = this.#layout;
    const rows = await this.#query(
      `SELECT ${this.#layout.columns({ bodyBytes: PREVIEW_BYTES })} FROM ${table}
       WHERE ${key} = ${this.#dialect.placeholder(1)} AND ${live}`,
      [this.#dialect.keyParam(storeKey)],
    );
    return rows[0] === undefined ? undefined : this.#view(rows[0]);
  }

  async delete(storeKey: string): Promise<boolean> {
    try {
      return await this.#dialect.deleteKey(storeKey);
    } catch (error) {
      throw this.#failure(error);
    }
  }

  async list({ inProgress, scope, limit, cursor }: ListOptions): Promise<ListPage> {
    const { table, key, state } = this.#layout;
    const after = cursor === undefined ? undefined : decodeCursor(cursor);
    const size = Math.min(limit, MAX_PAGE);
    const window = Math.min(Math.max(size * 4, MIN_WINDOW), MAX_WINDOW);
    const wanted = inProgress === true ? `${state} = 'in_progress'` : `${state} IS NOT NULL`;
    // Keys only, in primary-key order from the cursor: which of them the page shows is decided on this window.
    const keys = await this.#query(
      `SELECT ${key} AS k, ${wanted} AS hit FROM ${table}
       ${after === undefined ? '' : `WHERE ${key} > ${this.#dialect.placeholder(1)}`}
       ORDER BY ${key} LIMIT ${window}`,
      after === undefined ? [] : [this.#dialect.keyParam(after)],
    );
    const chosen: string[] = [];
    let last: string | undefined;
    let stoppedAt = keys.length;
    for (const [i, row] of keys.entries()) {
      const storeKey = this.#dialect.keyText(row.k);
      if (truthy(row.hit) && inScope(storeKey, scope)) chosen.push(storeKey);
      last = storeKey;
      if (chosen.length === size) {
        stoppedAt = i + 1;
        break;
      }
    }
    // More may follow when the page stopped inside the window, or the window was full.
    const more = stoppedAt < keys.length || keys.length === window;
    const page: ListPage = { records: [] };
    if (chosen.length > 0) {
      const placeholders = chosen.map((_, i) => this.#dialect.placeholder(i + 1)).join(', ');
      const rows = await this.#query(
        `SELECT ${this.#layout.columns({ bodyBytes: PREVIEW_BYTES })} FROM ${table}
         WHERE ${key} IN (${placeholders}) AND ${wanted} ORDER BY ${key}`,
        chosen.map((k) => this.#dialect.keyParam(k)),
      );
      page.records = rows.map((row) => this.#view(row));
    }
    if (more && last !== undefined) page.cursor = encodeCursor(last);
    return page;
  }

  async stats(onProgress?: (scanned: number) => void): Promise<Stats> {
    const { table, key, state } = this.#layout;
    const byState = noRecords();
    const count = (name: string) => `SUM(CASE WHEN s = '${name}' THEN 1 ELSE 0 END) AS ${name}`;
    let after: string | undefined;
    let scanned = 0;
    for (;;) {
      // One bounded statement per batch, walking the primary key: never one scan of the whole table.
      const [row] = await this.#query(
        `SELECT COUNT(*) AS n, MAX(k) AS last, ${count('in_progress')}, ${count('completed')}, ${count('released')}
         FROM (SELECT ${key} AS k, ${state} AS s FROM ${table}
           ${after === undefined ? '' : `WHERE ${key} > ${this.#dialect.placeholder(1)}`}
           ORDER BY ${key} LIMIT ${STATS_BATCH}) w`,
        after === undefined ? [] : [this.#dialect.keyParam(after)],
      );
      const n = Number(row?.n ?? 0);
      if (row === undefined || n === 0) break;
      byState.in_progress += Number(row.in_progress ?? 0);
      byState.completed += Number(row.completed ?? 0);
      byState.released += Number(row.released ?? 0);
      scanned += n;
      onProgress?.(scanned);
      if (n < STATS_BATCH) break;
      after = this.#dialect.keyText(row.last);
    }
    const stats: Stats = {
      byState,
      records: byState.in_progress + byState.completed + byState.released,
      unknown: 0,
    };
    let bytes: number | undefined;
    try {
      bytes = await this.#dialect.tableBytes();
    } catch (error) {
      throw this.#failure(error);
    }
    if (bytes !== undefined) stats.bytes = bytes;
    return stats;
  }

  close(): Promise<void> {
    return this.#dialect.close();
  }

  #view(row: Record<string, unknown>): RecordView {
    const decoded = this.#dialect.decode(row);
    const extra: { createdAt: Date; bytes?: number } = { createdAt: new Date(decoded.createdAt) };
    if (decoded.rowBytes !== undefined) extra.bytes = decoded.rowBytes;
    const view = recordView(
      decoded.key,
      `${this.#layout.table} ${JSON.stringify(decoded.key)}`,
      decoded.record,
      decoded.now,
      extra,
    );
    // The body was read up to the preview's length: its size is the column's.
    if (view.response !== undefined) view.response.bodyBytes = decoded.bodyBytes;
    return view;
  }

  async #query(statement: string, params: readonly unknown[]): Promise<Record<string, unknown>[]> {
    try {
      return await this.#dialect.query(statement, params);
    } catch (error) {
      throw this.#failure(error);
    }
  }

  #failure(error: unknown): CliError {
    if (isCliError(error)) return error;
    const missing = this.#dialect.missing(error);
    const reason = error instanceof Error ? error.message : String(error);
    if (missing === 'table') {
      return new CliError(
        EXIT.unknownLayout,
        `no table ${this.#layout.table} in ${this.#dialect.where} (${reason}): pass the store's table with --table, or run the store's migrate() once`,
        { cause: error },
      );
    }
    if (missing === 'column') {
      return new CliError(
        EXIT.unknownLayout,
        `${this.#layout.table} is not an oncely records table of a layout this version knows (${reason}): pass the store's table with --table, run the store's migrate() once, or upgrade @oncely/cli`,
        { cause: error },
      );
    }
    return unreachable(this.#dialect.where, error);
  }
}
