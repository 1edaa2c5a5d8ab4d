import type { Pool, PoolClient } from 'pg';

/** A client checked out of the pool, with the connection failure it met while held (if any). */
export interface HeldClient {
  client: PoolClient;
  /**
   * Whether the connection is known to be unusable: it failed while held (the server stopped or restarted, the
   * network cut), or a statement on it got no answer within `query_timeout` (the statement is still pending on it,
   * so a ROLLBACK would only queue behind it). Such a client is released to be destroyed, without a ROLLBACK: the
   * server rolls back a session whose connection closes.
   */
  broken(error?: unknown): boolean;
  /** Gives the client back; destroyed if it is broken or `error` is an Error. Idempotent. */
  release(error?: unknown): void;
}

/**
 * Checks a client out of `pool` and listens for its errors while it is held. pg-pool takes its own 'error' listener
 * off a client it hands out, and a `pg` client emits 'error' when its connection ends unexpectedly, even with no
 * query running: with no listener, the process would crash (an unhandled 'error' event) whenever the database went
 * away while a transaction was open. `outages.test.ts` kills the server under an open transaction.
 */
export async function hold(pool: Pool): Promise<HeldClient> {
  const client = await pool.connect();
  let failure: Error | undefined;
  const onError = (error: Error) => {
    failure ??= error;
  };
  client.on('error', onError);
  let released = false;
  return {
    client,
    // pg's client-side `query_timeout` rejects with this message and leaves the statement pending on the connection.
    broken: (error) =>
      failure !== undefined || (error instanceof Error && error.message === 'Query read timeout'),
    release: (error) => {
      if (released) return;
      released = true;
      client.removeListener('error', onError);
      client.release(failure ?? (error instanceof Error ? error : undefined));
    },
  };
}
