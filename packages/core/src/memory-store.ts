import { type Duration, parseDuration } from './duration';
import { IdempotencyOptionsError } from './errors';
import type {
  AcquireOptions,
  AcquireResult,
  IdempotencyRecord,
  IdempotencyStore,
  StoredResponse,
} from './store';

export interface MemoryStoreOptions {
  /** Most completed records kept; the least recently used is evicted first. Default: `10_000`. */
  maxEntries?: number;
  /** How often expired records are swept out of memory (reads never see them either way). Default: `'1s'`. */
  sweepInterval?: Duration;
}

interface Entry {
  key: string;
  fingerprint: string;
  state: 'in_progress' | 'completed';
  token: string;
  lockExpiresAt: number;
  expiresAt: number;
  response: StoredResponse | undefined;
  // LRU links among completed records (older ← → younger).
  older: Entry | undefined;
  younger: Entry | undefined;
}

interface HeapItem {
  at: number;
  key: string;
  entry: Entry;
}

/**
 * The embedded store: one process, nothing to run. Completed records sit in an LRU bounded by `maxEntries`;
 * in-progress records are never evicted (evicting a live lease would let a duplicate run) and are bounded by
 * the requests in flight. Expiry is exact on every read; a min-heap of expiry times lets the sweep visit only
 * records that have expired, never the whole store. The sweep timer is `unref`'d.
 */
export class MemoryStore implements IdempotencyStore {
  readonly #maxEntries: number;
  readonly #completed = new Map<string, Entry>();
  // LRU order of completed records as a linked list, not as Map insertion order: V8's Map keeps deleted
  // entries as holes until it rehashes, so evicting with `keys().next()` after many deletes scans the holes.
  // That made `complete` 12% of a Fastify + MemoryStore first-execution profile (docs/benchmarks.md).
  #oldest: Entry | undefined;
  #youngest: Entry | undefined;
  readonly #leases = new Map<string, Entry>();
  readonly #heap: HeapItem[] = [];
  readonly #waiters = new Map<string, Set<() => void>>();
  readonly #timer: NodeJS.Timeout;
  #tokens = 0;

  constructor(options: MemoryStoreOptions = {}) {
    const maxEntries = options.maxEntries ?? 10_000;
    if (!Number.isSafeInteger(maxEntries) || maxEntries < 1) {
      throw new IdempotencyOptionsError(
        'maxEntries',
        `must be a positive integer; got ${JSON.stringify(maxEntries)}.`,
      );
    }
    this.#maxEntries = maxEntries;
    let sweepMs: number;
    try {
      sweepMs = parseDuration(options.sweepInterval ?? '1s');
    } catch {
      throw new IdempotencyOptionsError(
        'sweepInterval',
        `must be a duration like '1s'; got ${JSON.stringify(options.sweepInterval)}.`,
      );
    }
    this.#timer = setInterval(() => this.#sweep(Date.now()), Math.max(sweepMs, 10));
    this.#timer.unref();
  }

  /** Records held (completed and in progress). */
  get size(): number {
    return this.#completed.size + this.#leases.size;
  }

  async acquire(key: string, { fingerprint, lockTimeoutMs }: AcquireOptions): Promise<AcquireResult> {
    const now = Date.now();
    const done = this.#completed.get(key);
    if (done !== undefined) {
      if (done.expiresAt > now) {
        // LRU touch: move to the young end.
        this.#unlink(done);
        this.#append(done);
        return {
          status: 'completed',
          fingerprint: done.fingerprint,
          response: done.response as StoredResponse,
        };
      }
      this.#removeCompleted(done);
    }
    const lease = this.#leases.get(key);
    if (lease !== undefined && lease.lockExpiresAt > now) {
      return {
        status: 'in_progress',
        fingerprint: lease.fingerprint,
        retryAfterMs: lease.lockExpiresAt - now,
      };
    }
    const token = `m${++this.#tokens}`;
    const expiresAt = now + lockTimeoutMs;
    const entry: Entry = {
      key,
      fingerprint,
      state: 'in_progress',
      token,
      lockExpiresAt: expiresAt,
      expiresAt,
      response: undefined,
      older: undefined,
      younger: undefined,
    };
    this.#leases.set(key, entry);
    this.#schedule(key, entry);
    return { status: 'acquired', token };
  }

  async complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    const now = Date.now();
    const lease = this.#owned(key, token, now);
    if (lease === undefined) return false;
    this.#leases.delete(key);
    lease.state = 'completed';
    lease.response = response;
    lease.expiresAt = now + ttlMs;
    this.#completed.set(key, lease);
    this.#append(lease);
    this.#schedule(key, lease);
    if (this.#completed.size > this.#maxEntries) this.#removeCompleted(this.#oldest as Entry);
    this.#wake(key);
    return true;
  }

  async release(key: string, token: string): Promise<boolean> {
    if (this.#owned(key, token, Date.now()) === undefined) return false;
    this.#leases.delete(key);
    this.#wake(key);
    return true;
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    const now = Date.now();
    const lease = this.#owned(key, token, now);
    if (lease === undefined) return false;
    lease.lockExpiresAt = lease.expiresAt = now + lockTimeoutMs;
    this.#schedule(key, lease);
    return true;
  }

  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const now = Date.now();
    const entry = this.#completed.get(key) ?? this.#leases.get(key);
    if (entry === undefined || entry.expiresAt <= now) return undefined;
    const { fingerprint, state, token, lockExpiresAt, expiresAt, response } = entry;
    const record: IdempotencyRecord = { fingerprint, state, token, lockExpiresAt, expiresAt };
    if (response !== undefined) record.response = response;
    return record;
  }

  async delete(key: string): Promise<boolean> {
    const done = this.#completed.get(key);
    if (done !== undefined) this.#removeCompleted(done);
    const existed = done !== undefined || this.#leases.delete(key);
    if (existed) this.#wake(key);
    return existed;
  }

  waitFor(key: string, timeoutMs: number): Promise<void> {
    const lease = this.#leases.get(key);
    if (lease === undefined || lease.lockExpiresAt <= Date.now()) return Promise.resolve();
    return new Promise((resolve) => {
      let set = this.#waiters.get(key);
      if (set === undefined) {
        set = new Set();
        this.#waiters.set(key, set);
      }
      const waiters = set;
      const done = (): void => {
        clearTimeout(timer);
        waiters.delete(done);
        if (waiters.size === 0 && this.#waiters.get(key) === waiters) this.#waiters.delete(key);
        resolve();
      };
      // The lease itself may run out before anyone completes it: wake then at the latest.
      const timer = setTimeout(done, Math.min(timeoutMs, lease.lockExpiresAt - Date.now() + 1));
      timer.unref();
      waiters.add(done);
    });
  }

  async close(): Promise<void> {
    clearInterval(this.#timer);
    for (const waiters of this.#waiters.values()) for (const wake of [...waiters]) wake();
  }

  #append(entry: Entry): void {
    entry.older = this.#youngest;
    entry.younger = undefined;
    if (this.#youngest !== undefined) this.#youngest.younger = entry;
    else this.#oldest = entry;
    this.#youngest = entry;
  }

  #unlink(entry: Entry): void {
    if (entry.older !== undefined) entry.older.younger = entry.younger;
    else this.#oldest = entry.younger;
    if (entry.younger !== undefined) entry.younger.older = entry.older;
    else this.#youngest = entry.older;
    entry.older = entry.younger = undefined;
  }

  #removeCompleted(entry: Entry): void {
    this.#unlink(entry);
    this.#completed.delete(entry.key);
  }

  #owned(key: string, token: string, now: number): Entry | undefined {
    const lease = this.#leases.get(key);
    return lease !== undefined && lease.token === token && lease.lockExpiresAt > now ? lease : undefined;
  }

  #wake(key: string): void {
    const waiters = this.#waiters.get(key);
    if (waiters !== undefined) for (const wake of [...waiters]) wake();
  }

  // Min-heap by expiry time. Items go stale when a record is renewed, completed or removed; the sweep skips
  // them, and the heap is rebuilt when stale items outnumber live records.
  #schedule(key: string, entry: Entry): void {
    const heap = this.#heap;
    heap.push({ at: entry.expiresAt, key, entry });
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if ((heap[parent] as HeapItem).at <= (heap[i] as HeapItem).at) break;
      [heap[parent], heap[i]] = [heap[i] as HeapItem, heap[parent] as HeapItem];
      i = parent;
    }
  }

  #pop(): HeapItem | undefined {
    const heap = this.#heap;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0 && last !== undefined) {
      heap[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && (heap[l] as HeapItem).at < (heap[m] as HeapItem).at) m = l;
        if (r < heap.length && (heap[r] as HeapItem).at < (heap[m] as HeapItem).at) m = r;
        if (m === i) break;
        [heap[m], heap[i]] = [heap[i] as HeapItem, heap[m] as HeapItem];
        i = m;
      }
    }
    return top;
  }

  #sweep(now: number): void {
    while (this.#heap.length > 0 && (this.#heap[0] as HeapItem).at <= now) {
      const { key, entry } = this.#pop() as HeapItem;
      if (entry.expiresAt > now) continue; // renewed or completed since: a later item covers it
      if (entry.state === 'completed') {
        if (this.#completed.get(key) === entry) this.#removeCompleted(entry);
      } else if (this.#leases.get(key) === entry) this.#leases.delete(key);
    }
    if (this.#heap.length > 2 * this.size + 1024) {
      // Too many stale items: rebuild from the live records.
      this.#heap.length = 0;
      for (const [key, entry] of this.#completed) this.#schedule(key, entry);
      for (const [key, entry] of this.#leases) this.#schedule(key, entry);
    }
  }
}
