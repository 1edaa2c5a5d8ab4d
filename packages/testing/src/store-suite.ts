import type { IdempotencyStore } from '@oncely/core';
import { storeSuite } from '@oncely/store-suite';

export interface StoreSuiteOptions {
  /** Creates the store under test; called once per test file (beforeAll). */
  create(): Promise<IdempotencyStore> | IdempotencyStore;
  /** Tears it down (afterAll). Defaults to `store.close?.()`. */
  destroy?(store: IdempotencyStore): Promise<void> | void;
  /** The shortest lease/TTL the tests may use, in ms. Default: 150. */
  shortMs?: number;
}

/** The published store suite (`@oncely/store-suite`) on jest's globals, as every store of this repository runs it. */
export function storeContractSuite(name: string, options: StoreSuiteOptions): void {
  storeSuite({ describe, test, before: beforeAll, after: afterAll }, { name, ...options });
}
