import type { Client, ClientConfig } from 'pg';
import { isCliError, loadDriver, unreachable, usageError, within } from '../errors';
import { SqlBackend } from './sql';
import type { BackendFactory } from './types';

/** SQLSTATEs of a missing table or schema (undefined_table, invalid_schema_name) and of a missing column. */
const NO_TABLE = new Set(['42P01', '3F000']);
const NO_COLUMN = '42703';

/** `--table`: `table` (in the store's default schema) or `schema.table`. */
function tableOption(text: string | undefined): { schema?: string; table?: string } {
  if (text === undefined) return {};
  const dot = text.indexOf('.');
  return dot < 0 ? { table: text } : { schema: text.slice(0, dot), table: text.slice(dot + 1) };
}

/**
 * PostgreSQL through `pg`: one connection, every statement bounded by the timeout (server and client side), the
 * records read with the layout and row decoder of `@oncely/postgres/records`, so the command sees what the store
 * sees.
 */
export const openPostgres: BackendFactory = async (options) => {
  const pg = await loadDriver('pg', () => import('pg'));
  const records = await import('@oncely/postgres/records');
  const { url, connectTimeoutMs, env } = options;
  let layout: ReturnType<typeof records.recordsLayout>;
  try {
    layout = records.recordsLayout(tableOption(options.table));
  } catch (error) {
    throw usageError(`--table ${(error as Error).message}`);
  }
  const host = url.hostname === '' ? 'localhost' : url.hostname;
  const where = `postgres ${host}:${url.port === '' ? 5432 : url.port}${url.pathname}`;
  const config: ClientConfig = {
    connectionString: url.href,
    connectionTimeoutMillis: connectTimeoutMs,
    query_timeout: connectTimeoutMs,
    statement_timeout: connectTimeoutMs,
    application_name: 'oncely-cli',
  };
  if (url.password === '' && env.PGPASSWORD !== undefined) config.password = env.PGPASSWORD;
  const Pg = (pg.default ?? pg) as unknown as typeof import('pg').default;
  const client: Client = new Pg.Client(config);
  // Errors reach the caller through connect() and the queries; the event would only repeat them.
  client.on('error', () => {});
  const end = async () => {
    await within(client.end(), 1000, where).catch(() => {});
  };
  try {
    await within(client.connect(), connectTimeoutMs, where);
  } catch (error) {
    await end();
    throw isCliError(error) ? error : unreachable(where, error);
  }
  return SqlBackend.open({
    where,
    layout,
    decode: records.decodeRecord,
    query: async (statement, params) => (await client.query(statement, params as unknown[])).rows,
    placeholder: (n) => `$${n}`,
    keyParam: (key) => key,
    keyText: (value) => String(value),
    deleteKey: async (key) => {
      const { rows } = await client.query(
        `DELETE FROM ${layout.table} WHERE ${layout.key} = $1 RETURNING ${layout.live} AS live`,
        [key],
      );
      return rows[0]?.live === true;
    },
    tableBytes: async () => {
      // The table with its TOAST data and indexes, dead rows and rows the reaper has not deleted yet included.
      const { rows } = await client.query('SELECT pg_total_relation_size(to_regclass($1))::bigint AS bytes', [
        layout.table,
      ]);
      return rows[0]?.bytes === null || rows[0]?.bytes === undefined ? undefined : Number(rows[0].bytes);
    },
    missing: (error) => {
      const code = String((error as { code?: unknown } | null)?.code);
      return NO_TABLE.has(code) ? 'table' : code === NO_COLUMN ? 'column' : undefined;
    },
    close: end,
  });
};
