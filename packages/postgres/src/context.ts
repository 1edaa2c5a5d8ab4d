import { IdempotencySetupError } from '@oncely/core';
import type { PoolClient } from 'pg';
import type { TransactionSql } from 'postgres';

/**
 * The transaction's client for a request in transactional mode (`req.idempotency.db`, typed). Throws if the
 * request is not covered or the adapter is not `transactional: true`, rather than let writes escape the
 * transaction silently.
 */
export function transactionClient(request: { idempotency?: { db: unknown } | undefined }): PoolClient {
  const db = request.idempotency?.db;
  if (db === undefined || db === null) {
    throw new IdempotencySetupError(
      'oncely/postgres: this request has no idempotency transaction; use transactional: true on the adapter with a PostgresStore, and send an Idempotency-Key.',
    );
  }
  return db as PoolClient;
}

/**
 * The postgres.js transaction for a request in transactional mode on a store given `sql`
 * (`req.idempotency.db`, typed). Throws like `transactionClient` when there is none.
 */
export function transactionSql(request: { idempotency?: { db: unknown } | undefined }): TransactionSql {
  return transactionClient(request) as unknown as TransactionSql;
}
