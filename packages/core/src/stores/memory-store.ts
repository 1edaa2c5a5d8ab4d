import { type Duration, parseDuration } from '../shared/duration';
import { IdempotencyOptionsError } from '../shared/errors';
import type {
  AcquireOptions,
  AcquireResult,
  IdempotencyRecord,
  IdempotencyStore,
  RecordState,
  StoredResponse,
} from './store';

/** Options of `MemoryStore`. */
export interface MemoryStoreOptions {
  /**
   * Most completed records kept; the least recently used is evicted first. Default: `10_000`. Records in progress
   * and released records that carry steps are not counted and never evicted (see `MemoryStore`).
   */
  maxEntries?: number;
  /** How often expired records are swept out of memory (reads never see them either way). Default: `'1s'`. */
  sweepInterval?: Duration;
}

/** Size of the slabs short bodies are copied into, as Node's own Buffer pool. */
const SLAB_BYTES = 8192;

const EMPTY = new Uint8Array(0);

/**
 * The clock of leases and ttls: monotonic, so a wall-clock step (NTP, a VM resumed) neither ends a live lease early,
 * which would let a duplicate run beside the first, nor keeps records past their time. Records live in this process
 * only, which is the clock's scope too.
 */
const clock: () => number =
  typeof performance === 'object' && typeof performance.now === 'function'
    ? () => performance.now()
    : Date.now;

/** The steps a record carries (`recordStep`), and until when they keep the record: ttlMs after the latest step. */
interface Steps {
  values: Map<string, string>;
  keptUntil: number;
}

// A record's `state` says which list holds it: `in_progress` the leases (also once its lease ran out, until the
// sweep or an acquire looks at it), `completed` the LRU, `released` the released records that carry steps.
interface Entry {
  key: string;
  fingerprint: string;
  state: RecordState;
  token: string;
  // When the lease ends, or ended: for a released record, when it was released.
  lockExpiresAt: number;
  // When the record is gone: a lease's end; with steps, the later of that and `steps.keptUntil`; a response's ttl.
  expiresAt: number;
  response: StoredResponse | undefined;
  // One field, undefined for a record without steps: no allocation and one test on the paths that have none.
  steps: Steps | undefined;
  // Links in the record's list: the LRU of completed records, the leases, or the released records (older ← → younger).
  older: Entry | undefined;
  younger: Entry | undefined;
}

/** A doubly linked list of records, through their own links: no allocation and no hashing to add or remove. */
interface List {
  oldest: Entry | undefined;
  youngest: Entry | undefined;
}

function append(list: List, entry: Entry): void {
  entry.older = list.youngest;
  entry.younger = undefined;
  if (list.youngest !== undefined) list.youngest.younger = entry;
  else list.oldest = entry;
  list.youngest = entry;
}

function unlink(list: List, entry: Entry): void {
  if (entry.older !== undefined) entry.older.younger = entry.younger;
  else list.oldest = entry.younger;
  if (entry.younger !== undefined) entry.younger.older = entry.older;
  else list.youngest = entry.older;
  entry.older = entry.younger = undefined;
}

/**
 * A store call's answer, given on the event loop's check phase (`setImmediate`); its effect (the lease taken, the
 * record stored) happens at once. As with a networked store, a loaded server then runs the handlers of one loop
 * turn's requests together rather than one between each two socket reads, which costs far more CPU (figures in
 * docs/benchmarks.md, "Earlier analyses"). Where `setImmediate` does not exist, at once.
 */
function answerSoon<T>(value: T): Promise<T> {
  if (typeof setImmediate !== 'function') return Promise.resolve(value);
  return new Promise((resolve) => setImmediate(resolve, value));
}

/**
 * The embedded store: one process, nothing to run. Completed records sit in an LRU bounded by `maxEntries`;
 * in-progress records are never evicted (evicting a live lease would let a duplicate run) and are bounded by
 * the requests in flight. Released records that carry steps are not evicted either (evicting one would run its
 * recorded steps again on the retry): they are bounded by their ttl, as many as the executions that recorded
 * steps and did not complete within it. Expiry is exact on every read; the sweep frees expired records' memory,
 * visiting only completed records that have expired (a min-heap), the leases in flight and the released records.
 * The sweep timer is `unref`'d.
 *
 * One Map holds every record, and a record is one object from acquire to eviction: `complete` turns the lease
 * into the completed record in place: a first execution costs two Map operations and one heap slot, where separate
 * Maps for leases and completed records cost six operations and two allocations that outlived it.
 */
export class MemoryStore implements IdempotencyStore {
  readonly #maxEntries: number;
  readonly #records = new Map<string, Entry>();
  #completedCount = 0;
  // LRU order of completed records as a linked list, not as Map insertion order: V8's Map keeps deleted
  // entries as holes until it rehashes, so evicting with `keys().next()` after many deletes scans the holes.
  readonly #lru: List = { oldest: undefined, youngest: undefined };
  // The leases in flight, for the sweep: a list through the records, as a Set's table churns on every request.
  readonly #leases: List = { oldest: undefined, youngest: undefined };
  // Released records that carry steps, for the sweep to drop once they expire.
  readonly #released: List = { oldest: undefined, youngest: undefined };
  // Min-heap of completed records by `expiresAt`, which never changes once a record is completed. A record
  // evicted or deleted stays in the heap until the sweep pops it (it is no longer the Map's entry for its key);
  // the heap is rebuilt when such stale items outnumber the live ones.
  readonly #heap: Entry[] = [];
  readonly #waiters = new Map<string, Set<() => void>>();
  readonly #timer: NodeJS.Timeout;
  #tokens = 0;
  // Where short bodies are copied (#ownBytes): records only, so a slab is freed once its records are.
  #slab: Uint8Array | undefined;
  #slabUsed = 0;

  /** Makes an empty store; throws `IdempotencyOptionsError` for a wrong option. */
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
    this.#timer = setInterval(() => this.#sweep(clock()), Math.max(sweepMs, 10));
    this.#timer.unref();
  }

  /** Records held (completed, in progress, and released ones that carry steps). */
  get size(): number {
    return this.#records.size;
  }

  acquire(key: string, options: AcquireOptions): Promise<AcquireResult> {
    try {
      return answerSoon(this.#acquireNow(key, options));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  #acquireNow(key: string, { fingerprint, lockTimeoutMs }: AcquireOptions): AcquireResult {
    const now = clock();
    const entry = this.#records.get(key);
    if (entry !== undefined) {
      if (entry.state === 'completed') {
        if (entry.expiresAt > now) {
          // LRU touch: move to the young end.
          unlink(this.#lru, entry);
          append(this.#lru, entry);
          return { status: 'completed', fingerprint: entry.fingerprint, response: handedOut(entry) };
        }
        this.#removeCompleted(entry);
      } else if (entry.lockExpiresAt > now) {
        return {
          status: 'in_progress',
          fingerprint: entry.fingerprint,
          retryAfterMs: Math.ceil(entry.lockExpiresAt - now),
        };
      } else if (entry.expiresAt > now) {
        // Released, or its lease ran out, and kept for its steps: resumed in place.
        return this.#resume(entry, now, lockTimeoutMs);
      } else this.#unlinkOpen(entry); // a lease that ran out, or a released record that expired: taken over below
    }
    const token = `m${++this.#tokens}`;
    const expiresAt = now + lockTimeoutMs;
    const lease: Entry = {
      key,
      fingerprint,
      state: 'in_progress',
      token,
      lockExpiresAt: expiresAt,
      expiresAt,
      response: undefined,
      steps: undefined,
      older: undefined,
      younger: undefined,
    };
    this.#records.set(key, lease);
    append(this.#leases, lease);
    return { status: 'acquired', token };
  }

  /** Takes a record that carries steps and is held by nobody: a new token and lease, its fingerprint and steps kept. */
  #resume(entry: Entry, now: number, lockTimeoutMs: number): AcquireResult {
    const steps = entry.steps as Steps;
    this.#unlinkOpen(entry);
    entry.state = 'in_progress';
    entry.token = `m${++this.#tokens}`;
    entry.lockExpiresAt = now + lockTimeoutMs;
    entry.expiresAt = Math.max(entry.lockExpiresAt, steps.keptUntil);
    append(this.#leases, entry);
    return {
      status: 'acquired',
      token: entry.token,
      steps: Object.fromEntries(steps.values),
      fingerprint: entry.fingerprint,
    };
  }

  complete(key: string, token: string, response: StoredResponse, ttlMs: number): Promise<boolean> {
    try {
      return answerSoon(this.#completeNow(key, token, response, ttlMs));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  #completeNow(key: string, token: string, response: StoredResponse, ttlMs: number): boolean {
    const now = clock();
    const lease = this.#owned(key, token, now);
    if (lease === undefined) return false;
    unlink(this.#leases, lease);
    lease.state = 'completed';
    lease.steps = undefined;
    lease.response = {
      status: response.status,
      headers: ownHeaders(response.headers),
      body: this.#ownBytes(response.body),
    };
    lease.expiresAt = now + ttlMs;
    this.#completedCount++;
    append(this.#lru, lease);
    this.#push(lease);
    if (this.#completedCount > this.#maxEntries) this.#removeCompleted(this.#lru.oldest as Entry);
    this.#dropStaleHeapItems();
    this.#wake(key);
    return true;
  }

  /**
   * The body as the record keeps it: always a copy, since the caller's buffer is the handler's (a pool, a buffer
   * refilled per request), and a record pointing at it would replay whatever it holds next. A short body goes into
   * a slab of this store's own (a view of Node's 8 KB pool kept as it is would keep the whole pool alive), a longer
   * one into a buffer of its own.
   */
  #ownBytes(body: Uint8Array): Uint8Array {
    const length = body.byteLength;
    if (length === 0) return EMPTY;
    if (length > SLAB_BYTES / 8) return new Uint8Array(body);
    if (this.#slab === undefined || this.#slabUsed + length > SLAB_BYTES) {
      this.#slab = new Uint8Array(SLAB_BYTES);
      this.#slabUsed = 0;
    }
    const start = this.#slabUsed;
    this.#slab.set(body, start);
    this.#slabUsed = start + length;
    return this.#slab.subarray(start, start + length);
  }

  async release(key: string, token: string): Promise<boolean> {
    const now = clock();
    const lease = this.#owned(key, token, now);
    if (lease === undefined) return false;
    if (lease.steps !== undefined && lease.steps.keptUntil > now) {
      // Kept for its steps, free for the next acquire, until ttlMs after its latest step.
      unlink(this.#leases, lease);
      lease.state = 'released';
      lease.lockExpiresAt = now;
      lease.expiresAt = lease.steps.keptUntil;
      append(this.#released, lease);
    } else this.#removeLease(lease);
    this.#wake(key);
    return true;
  }

  async renew(key: string, token: string, lockTimeoutMs: number): Promise<boolean> {
    const now = clock();
    const lease = this.#owned(key, token, now);
    if (lease === undefined) return false;
    const lockExpiresAt = now + lockTimeoutMs;
    lease.lockExpiresAt = lockExpiresAt;
    lease.expiresAt =
      lease.steps === undefined ? lockExpiresAt : Math.max(lockExpiresAt, lease.steps.keptUntil);
    return true;
  }

  async recordStep(key: string, token: string, name: string, value: string, ttlMs: number): Promise<boolean> {
    const now = clock();
    const lease = this.#owned(key, token, now);
    if (lease === undefined) return false;
    const keptUntil = now + ttlMs;
    if (lease.steps === undefined) lease.steps = { values: new Map([[name, value]]), keptUntil };
    else {
      lease.steps.values.set(name, value);
      lease.steps.keptUntil = keptUntil;
    }
    lease.expiresAt = Math.max(lease.lockExpiresAt, keptUntil);
    return true;
  }

  /** The store keys of the records held and not expired (scope and key), for inspection and tests. */
  *keys(): IterableIterator<string> {
    const now = clock();
    for (const [key, entry] of this.#records) if (entry.expiresAt > now) yield key;
  }

  async get(key: string): Promise<IdempotencyRecord | undefined> {
    const now = clock();
    const entry = this.#records.get(key);
    if (entry === undefined || entry.expiresAt <= now) return undefined;
    // Epoch milliseconds for the caller: the monotonic times' distance from now, on the wall clock.
    const wall = Date.now() - now;
    const record: IdempotencyRecord = {
      fingerprint: entry.fingerprint,
      // A live record whose lease ran out is one kept for its steps: released, as if the sweep had moved it.
      state: entry.state === 'in_progress' && entry.lockExpiresAt <= now ? 'released' : entry.state,
      token: entry.token,
      lockExpiresAt: Math.round(entry.lockExpiresAt + wall),
      expiresAt: Math.round(entry.expiresAt + wall),
    };
    if (entry.response !== undefined) record.response = handedOut(entry);
    if (entry.steps !== undefined) record.steps = Object.fromEntries(entry.steps.values);
    return record;
  }

  async delete(key: string): Promise<boolean> {
    const entry = this.#records.get(key);
    if (entry === undefined) return false;
    if (entry.state === 'completed') {
      this.#removeCompleted(entry);
      this.#dropStaleHeapItems();
    } else this.#removeLease(entry);
    this.#wake(key);
    // A record whose lease or TTL ran out was not there for any other method either (only not yet swept).
    return entry.expiresAt > clock();
  }

  waitFor(key: string, timeoutMs: number): Promise<void> {
    const lease = this.#records.get(key);
    if (lease === undefined || lease.state !== 'in_progress' || lease.lockExpiresAt <= clock())
      return Promise.resolve();
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
      const timer = setTimeout(done, Math.min(timeoutMs, Math.ceil(lease.lockExpiresAt - clock()) + 1));
      timer.unref();
      waiters.add(done);
    });
  }

  async close(): Promise<void> {
    clearInterval(this.#timer);
    for (const waiters of this.#waiters.values()) for (const wake of [...waiters]) wake();
  }

  #removeCompleted(entry: Entry): void {
    unlink(this.#lru, entry);
    this.#records.delete(entry.key);
    this.#completedCount--;
    // The heap keeps the entry until its expiry comes up (#sweep) or a rebuild: not its body.
    entry.response = undefined;
  }

  /** Removes a record that is not completed: a lease (live or not), or a released record. */
  #removeLease(entry: Entry): void {
    this.#unlinkOpen(entry);
    this.#records.delete(entry.key);
  }

  /** Takes a record that is not completed out of its list, which its state names. */
  #unlinkOpen(entry: Entry): void {
    unlink(entry.state === 'released' ? this.#released : this.#leases, entry);
  }

  #owned(key: string, token: string, now: number): Entry | undefined {
    const lease = this.#records.get(key);
    return lease !== undefined &&
      lease.token === token &&
      lease.state === 'in_progress' &&
      lease.lockExpiresAt > now
      ? lease
      : undefined;
  }

  #wake(key: string): void {
    const waiters = this.#waiters.get(key);
    if (waiters !== undefined) for (const wake of [...waiters]) wake();
  }

  #push(entry: Entry): void {
    const heap = this.#heap;
    heap.push(entry);
    // Records completed with one ttl arrive in expiry order, so this loop usually stops at its first test.
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const above = heap[parent] as Entry;
      if (above.expiresAt <= entry.expiresAt) break;
      heap[i] = above;
      i = parent;
    }
    heap[i] = entry;
  }

  #pop(): Entry | undefined {
    const heap = this.#heap;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0 && last !== undefined) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= heap.length) break;
        const r = l + 1;
        const m = r < heap.length && (heap[r] as Entry).expiresAt < (heap[l] as Entry).expiresAt ? r : l;
        if ((heap[m] as Entry).expiresAt >= last.expiresAt) break;
        heap[i] = heap[m] as Entry;
        i = m;
      }
      heap[i] = last;
    }
    return top;
  }

  #sweep(now: number): void {
    const heap = this.#heap;
    while (heap.length > 0 && (heap[0] as Entry).expiresAt <= now) {
      const entry = this.#pop() as Entry;
      // Evicted or deleted since (or its key taken by a newer record): nothing to free.
      if (this.#records.get(entry.key) === entry) this.#removeCompleted(entry);
    }
    // Leases are few (the requests in flight): look at each rather than keep them in the heap.
    for (let lease = this.#leases.oldest; lease !== undefined; ) {
      const next = lease.younger;
      if (lease.expiresAt <= now) this.#removeLease(lease);
      else if (lease.lockExpiresAt <= now) {
        // Its lease ran out but its steps keep it: released.
        unlink(this.#leases, lease);
        lease.state = 'released';
        append(this.#released, lease);
      }
      lease = next;
    }
    // Released records with steps: as many as the executions that recorded steps and failed within the ttl.
    for (let entry = this.#released.oldest; entry !== undefined; ) {
      const next = entry.younger;
      if (entry.expiresAt <= now) this.#removeLease(entry);
      entry = next;
    }
    this.#dropStaleHeapItems();
  }

  /**
   * Rebuilds the heap from the live records once stale items (evicted, deleted) outnumber them by 1024, so what
   * the heap holds follows `maxEntries` whatever the ttl; amortised, a constant per removal.
   */
  #dropStaleHeapItems(): void {
    const heap = this.#heap;
    if (heap.length <= 2 * this.#completedCount + 1024) return;
    heap.length = 0;
    for (let entry = this.#lru.oldest; entry !== undefined; entry = entry.younger) this.#push(entry);
  }
}

/** Headers as a record keeps them: a frozen copy (arrays too), shared by every replay and changed by nobody. */
function ownHeaders(
  headers: Readonly<Record<string, string | readonly string[]>>,
): Record<string, string | string[]> {
  const own: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name] as string | readonly string[];
    own[name] = typeof value === 'string' ? value : (Object.freeze([...value]) as string[]);
  }
  return Object.freeze(own);
}

/**
 * A completed record's response as handed out: its own copy of the body, so a receiver that writes into it (an
 * outer middleware, a caller of `get`) cannot change what later replays send. `Buffer.from` takes a short copy
 * from Node's pool, a few times cheaper than `new Uint8Array`.
 */
function handedOut(entry: Entry): StoredResponse {
  const { status, headers, body } = entry.response as StoredResponse;
  return { status, headers, body: typeof Buffer === 'function' ? Buffer.from(body) : body.slice() };
}
