import { withinDeadline } from '@oncely/core/adapter';
import type { Pool, PoolConnection } from 'mysql2/promise';

/** What a statement that outlived `withQueryTimeout`'s deadline rejects with. */
export class QueryTimeoutError extends Error {
  /** mysql2's code for its own query timeout, so that code testing for it sees this one too. */
  readonly code = 'PROTOCOL_SEQUENCE_TIMEOUT';
  /** The connection it ran on was destroyed (as mysql2 marks errors that end a connection). */
  readonly fatal = true;
  /** Made when a statement got no answer within `timeoutMs`. */
  constructor(
    /** The deadline it outlived, in milliseconds. */
    readonly timeoutMs: number,
  ) {
    super(`oncely/mysql: no answer from the database within ${timeoutMs} ms; the connection was destroyed`);
    this.name = 'QueryTimeoutError';
  }
}

// The calls that wait for the server. mysql2's own `timeout` option does not cover them all: execute() prepares
// first, with no timer, and beginTransaction/commit/rollback take no options.
const TIMED = new Set<PropertyKey>(['execute', 'query', 'beginTransaction', 'commit', 'rollback', 'ping']);

/** Runs `work`; past `timeoutMs`, calls `expire` and rejects (a later outcome of `work` is then ignored). */
function within<T>(timeoutMs: number, work: () => Promise<T>, expire: () => void): Promise<T> {
  return withinDeadline(timeoutMs, work(), () => new QueryTimeoutError(timeoutMs), expire);
}

type Method = (...args: unknown[]) => Promise<unknown>;

function timedConnection(connection: PoolConnection, timeoutMs: number): PoolConnection {
  return new Proxy(connection, {
    get(target, property) {
      const value: unknown = Reflect.get(target, property, target);
      if (typeof value !== 'function') return value;
      if (!TIMED.has(property)) return value.bind(target);
      // A statement with no answer leaves the connection mid-protocol: destroy it (its transaction, if any, is
      // rolled back by the server once it notices), never hand it to the next caller.
      return (...args: unknown[]) =>
        within(
          timeoutMs,
          () => (value as Method).apply(target, args),
          () => target.destroy(),
        );
    },
  });
}

/**
 * `pool`, with a deadline of `timeoutMs` on every statement: waiting for a connection (a free one, or a new one
 * connecting), sending the statement (prepared or not) and reading its answer. Past it, the statement rejects with
 * `QueryTimeoutError` and its connection is destroyed. Connections from `getConnection()` carry the same deadline on
 * `execute`, `query`, `beginTransaction`, `commit`, `rollback` and `ping`.
 *
 * mysql2 has no pool-wide query timeout, and its per-query `timeout` does not cover the prepare step of `execute`:
 * against a hung server (SIGSTOP, a frozen VM), a pooled connection's statement waits forever without this.
 */
export function withQueryTimeout(pool: Pool, timeoutMs: number): Pool {
  if (!Number.isSafeInteger(timeoutMs) || timeoutMs < 1) {
    throw new RangeError(
      `oncely/mysql: withQueryTimeout needs a positive integer of ms; got ${String(timeoutMs)}`,
    );
  }
  const onPool = (use: (connection: PoolConnection) => Promise<unknown>) => {
    let held: PoolConnection | undefined;
    let expired = false;
    return within(
      timeoutMs,
      async () => {
        const connection = await pool.getConnection();
        if (expired) {
          connection.release();
          throw new QueryTimeoutError(timeoutMs);
        }
        held = connection;
        try {
          return await use(connection);
        } finally {
          // A no-op for a connection mysql2 (fatal error) or the deadline (destroy) took out of the pool.
          if (!expired) connection.release();
        }
      },
      () => {
        expired = true;
        held?.destroy();
      },
    );
  };
  return new Proxy(pool, {
    get(target, property) {
      const value: unknown = Reflect.get(target, property, target);
      if (typeof value !== 'function') return value;
      if (property === 'getConnection') {
        return () => {
          let expired = false;
          return within(
            timeoutMs,
            async () => {
              const connection = await target.getConnection();
              if (expired) connection.release();
              return timedConnection(connection, timeoutMs);
            },
            () => {
              expired = true;
            },
          );
        };
      }
      if (property === 'execute' || property === 'query') {
        return (...args: unknown[]) =>
          onPool((connection) => (Reflect.get(connection, property) as Method).apply(connection, args));
      }
      return value.bind(target);
    },
  });
}
