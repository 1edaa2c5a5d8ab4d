// Types shared by the store micro-benchmark child (store-bench.ts) and the runner.
import type { Services, StoreName } from './config';

export interface StoreBenchConfig {
  store: StoreName;
  services: Services;
  /** Seconds per measured phase. */
  duration: number;
  concurrency: number;
  /** Operations per counted phase. */
  countOps: number;
  keyPrefix: string;
}

export interface StoreBenchResult {
  store: StoreName;
  /** acquire (new key) + complete, per second. */
  acquireComplete: number;
  /** acquire on a completed key, per second. */
  replay: number;
  /** Round trips per operation: null for the in-process MemoryStore. */
  tripsFirst: number | null;
  tripsReplay: number | null;
  /** How the round trips were counted. */
  counter: string;
  /** PostgreSQL: bytes of WAL written per operation in the counted phases. */
  walBytesFirst?: number;
  walBytesReplay?: number;
}
