import { AsyncLocalStorage } from 'node:async_hooks';
import type { Jsonified, JsonStorable } from '../consumer/json';

/**
 * What code running under an idempotency key can read and do: a covered request's handler (`req.idempotency` on
 * Express, `request.idempotency` on Fastify, each adapter's equivalent), the function `idempotent()` wraps and every
 * consumer wrapper's handler. `currentIdempotency()` returns it from anywhere inside that execution.
 */
export interface IdempotencyContext {
  /** The key as the client (or the message) gave it: for HTTP, unquoted and without the scope. */
  readonly key: string;
  /** In transactional mode, the transaction's database client (a `pg` `PoolClient` for PostgresStore). */
  readonly db: unknown;
  /**
   * Runs `fn` once per key: its result is recorded under the execution's key before it is returned, and a later
   * attempt of the same key (after a crash, a lapsed lease, a released 5xx or a thrown error, a consumer's retry)
   * gets the recorded result without running `fn`. Resolves to the JSON round trip of the result (`undefined`
   * stays `undefined`), first run and replay alike. Rejects with `StepError` when the name was used already in
   * this attempt, the result cannot be stored, the store cannot record steps, or the execution no longer owns its
   * key (stop: another attempt may own it now).
   */
  step<T>(
    name: string,
    fn: () => (T & StepStorable<T>) | Promise<T & StepStorable<T>>,
  ): Promise<StepResult<T>>;
  /**
   * A key derived from the execution's key (scope included) and `name`, the same on every attempt, process and
   * version, for a downstream API's own idempotency key (`Idempotency-Key` to a payment provider): 43 characters of
   * base64url SHA-256 that reveal neither the scope nor the key. docs/steps.md gives the formula.
   */
  keyFor(name: string): string;
}

/**
 * What a step's function may return: a value JSON can store (see `JsonStorable`), or nothing (`undefined`, `void`:
 * a step that sends an email), alone or in a union. A result JSON cannot carry is a compile error.
 */
export type StepStorable<T> = T extends void ? T : JsonStorable<T>;

/** What `step()` resolves to: the JSON round trip of the function's result (`Jsonified`), `undefined` for nothing. */
export type StepResult<T> = T extends void ? undefined : Jsonified<T>;

const storage = new AsyncLocalStorage<IdempotencyContext>();

/**
 * The context of the execution the caller runs in (a covered handler, a function `idempotent()` wraps, a consumer
 * wrapper's handler), or `undefined` outside one: service code can call `step()` and `keyFor()` without being
 * handed the request.
 */
export function currentIdempotency(): IdempotencyContext | undefined {
  return storage.getStore();
}

/** Runs `fn` (and everything it starts) with `context` as `currentIdempotency()`. */
export function runInContext<T>(context: IdempotencyContext, fn: () => T): T {
  return storage.run(context, fn);
}
