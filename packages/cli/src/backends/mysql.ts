import type { Connection, ConnectionOptions } from 'mysql2/promise';
import { isCliError, loadDriver, unreachable, usageError, within } from '../errors';
import { SqlBackend } from './sql';
import type { BackendFactory } from './types';

const ER_NO_SUCH_TABLE = 1146;
const ER_BAD_FIELD_ERROR = 1054;

/**
 * MySQL or MariaDB through `mysql2`: one connection, every statement bounded by the timeout, the records read
 * with the layout and row decoder of `@oncely/mysql/records`, so the command sees what the store sees.
 */
export const openMySQL: BackendFactory = async (options) => {
  const mysql = await loadDriver('mysql2', () => import('mysql2/promise'));
  const records = await import('@oncely/mysql/records');
  const { url, connectTimeoutMs, env } = options;
  let layout: ReturnType<typeof records.recordsLayout>;
  try {
    layout = records.recordsLayout({ ...(options.table === undefined ? {} : { table: options.table }) });
  } catch (error) {
    throw usageError(`--table ${(error as Error).message}`);
  }
  const database = decodeURIComponent(url.pathname.slice(1));
  if (database === '' || database.includes('/')) {
    throw usageError(`the URL names no database: ${url.protocol}//HOST:PORT/DATABASE`);
  }
  const host = url.hostname === '' ? 'localhost' : url.hostname.replace(/^\[|\]$/g, '');
  const port = url.port === '' ? 3306 : Number(url.port);
  const where = `${url.protocol.slice(0, -1)} ${host}:${port}/${database}`;
  const config: ConnectionOptions = {
    host,
    port,
    database,
    user: url.username === '' ? (env.USER ?? 'root') : decodeURIComponent(url.username),
    connectTimeout: connectTimeoutMs,
  };
  if (url.password !== '') config.password = decodeURIComponent(url.password);
  else if (env.MYSQL_PWD !== undefined) config.password = env.MYSQL_PWD;
  const driver = (mysql.default ?? mysql) as unknown as typeof import('mysql2/promise');
  let connection: Connection;
  try {
    connection = await within(driver.createConnection(config), connectTimeoutMs, where);
  } catch (error) {
    throw isCliError(error) ? error : unreachable(where, error);
  }
  // Errors reach the caller through the queries; the event would only repeat them.
  connection.on('error', () => {});
  const query = async (sql: string, params: readonly unknown[]) => {
    const [rows] = await connection.query({ sql, timeout: connectTimeoutMs }, params as unknown[]);
    return rows;
  };
  const close = async () => {
    await within(connection.end(), 1000, where).catch(() => connection.destroy());
  };
  return SqlBackend.open({
    where,
    layout,
    decode: records.decodeRecord,
    query: async (sql, params) => (await query(sql, params)) as Record<string, unknown>[],
    placeholder: () => '?',
    // The key column is VARBINARY: the store key's UTF-8 bytes, compared byte by byte.
    keyParam: (key) => Buffer.from(key, 'utf8'),
    keyText: (value) => (Buffer.isBuffer(value) ? value.toString('utf8') : String(value)),
    deleteKey: async (key) => {
      // MySQL has no DELETE ... RETURNING: the row is gone either way, and it was live when the command showed it.
      const result = await query(`DELETE FROM ${layout.table} WHERE ${layout.key} = ?`, [
        Buffer.from(key, 'utf8'),
      ]);
      return (result as { affectedRows?: number }).affectedRows === 1;
    },
    tableBytes: async () => {
      // The server's estimate of the table's data and indexes (InnoDB refreshes it from time to time).
      const rows = (await query(
        `SELECT DATA_LENGTH + INDEX_LENGTH AS bytes FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,
        [layout.tableName],
      )) as { bytes: unknown }[];
      return rows[0]?.bytes === null || rows[0]?.bytes === undefined ? undefined : Number(rows[0].bytes);
    },
    missing: (error) => {
      const errno = Number((error as { errno?: unknown } | null)?.errno);
      return errno === ER_NO_SUCH_TABLE ? 'table' : errno === ER_BAD_FIELD_ERROR ? 'column' : undefined;
    },
    close,
  });
};
