import type { Execution } from '../http/execution';
import type { OutgoingHeaderValue } from '../http/headers';
import type { StoredResponse } from '../stores/store';

/** What the capture reads of a Node response (`http.ServerResponse`, `Http2ServerResponse`) when it settles. */
export interface NodeResponseHead {
  readonly statusCode: number;
  getHeaders(): Readonly<Record<string, OutgoingHeaderValue>>;
}

/** A chunk of a response body as Node's `write` and `end` take it. */
export type BodyChunk = string | Uint8Array;

/**
 * The body of one covered Node response and the decisions about it, for every Node adapter. It holds the body
 * until the response ends, up to `execution.bufferLimit` (`maxBodyBytes`; all of it in transactional mode), so a
 * client that got the answer always finds it replayable; a body that outgrows the limit is handed back to be sent
 * and the rest streams through, the record keeping its status only. What it holds is a copy of the caller's bytes:
 * a handler may refill its buffer once the write returned.
 *
 * A response can end in four ways, each decided here once:
 * - it ended whole (`finished`): stored (the status only when the body was over `maxBodyBytes`), or released when
 *   its status is not cacheable;
 * - the handler failed, before or while the body streamed (`failed`), over the limit or not: the key is released,
 *   as for any handler error, so a retry runs it again;
 * - the client left after the answer began (`clientLeft`, then `began`): the answer can never be completed, so the
 *   request is recorded as executed without a body (a retry gets a 410); before the answer began, the handler may
 *   still be doing the work, so nothing is decided until it begins;
 * - sending the answer failed (`sendFailed`): the key is released unless it was stored.
 */
export class ResponseCapture {
  readonly execution: Execution;
  readonly #res: NodeResponseHead;
  #chunks: Buffer[] = [];
  #size = 0;
  #streaming = false;
  #begun = false;
  #clientLeft = false;
  #decided = false;

  constructor(execution: Execution, res: NodeResponseHead) {
    this.execution = execution;
    this.#res = res;
  }

  /** Bytes seen so far (held or streamed). */
  get size(): number {
    return this.#size;
  }

  /** The body went over the limit: what comes now is sent as it comes, and only the status is kept. */
  get streaming(): boolean {
    return this.#streaming;
  }

  /** One of the decisions was taken: the adapter passes everything through from now on. */
  get decided(): boolean {
    return this.#decided;
  }

  /**
   * Marks the answer begun (a write, a head, a pipe into the response). Returns false when its client had left
   * already: the request is then recorded as executed, and what the handler sends goes on unheld.
   */
  began(): boolean {
    this.#begun = true;
    if (!this.#clientLeft) return true;
    this.#endedEarly();
    return false;
  }

  /**
   * Holds a chunk of the body. Returns false when it took the body over the limit: the adapter sends what `drain()`
   * hands back and passes the rest through (`streaming` is true from then on).
   */
  hold(chunk: BodyChunk, encoding?: BufferEncoding): boolean {
    const buffer = typeof chunk === 'string' ? Buffer.from(chunk, encoding ?? 'utf8') : Buffer.from(chunk);
    this.#size += buffer.byteLength;
    if (this.#streaming) return false;
    this.#chunks.push(buffer);
    if (this.#size <= this.execution.bufferLimit) return true;
    this.#streaming = true;
    return false;
  }

  /** Counts a chunk sent unheld (while streaming). */
  passed(chunk: BodyChunk): void {
    this.#size += typeof chunk === 'string' ? Buffer.byteLength(chunk) : chunk.byteLength;
  }

  /** Hands over what is held, to be sent; nothing stays held. */
  drain(): Buffer[] {
    const chunks = this.#chunks;
    this.#chunks = [];
    return chunks;
  }

  /** The held body as one buffer. */
  body(): Buffer {
    const chunks = this.#chunks;
    return chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, this.#size);
  }

  /**
   * The response ended whole, with this status and these headers: stored with its body when the body is within
   * `maxBodyBytes`, with its status only otherwise. Resolves to a response to send instead (a transactional commit
   * that failed), if any.
   */
  finished(
    status: number,
    headers: Readonly<Record<string, OutgoingHeaderValue>>,
    body: Buffer | undefined,
  ): Promise<StoredResponse | undefined> {
    this.#decided = true;
    return this.execution.complete({
      status,
      headers,
      body: !this.#streaming && this.#size <= this.execution.maxBodyBytes ? body : undefined,
    });
  }

  /** The handler failed, whether or not part of the body was sent: the key is released. */
  failed(error: unknown): Promise<void> {
    this.#decided = true;
    this.#chunks.length = 0;
    return this.execution.fail(error ?? new Error('the handler failed'));
  }

  /**
   * The client closed the connection before the response ended. An answer begun is recorded as executed now; one
   * not begun yet is decided when it begins (`began`), since the handler may still be doing the work.
   */
  clientLeft(): void {
    if (this.#decided) return;
    this.#clientLeft = true;
    if (this.#begun) this.#endedEarly();
  }

  /** Sending the answer threw: the adapter closed the connection; the key is released unless it was stored. */
  sendFailed(error: unknown): Promise<void> {
    this.#decided = true;
    return this.execution.sendFailed(error);
  }

  /**
   * The response went out without passing through the capture (Node's own methods called on it): recorded as
   * executed without a body once it finished, so its replay is a 410 and it never runs again.
   */
  wentAround(): void {
    if (this.#decided) return;
    this.#decided = true;
    this.#chunks.length = 0;
    void this.execution.complete({
      status: this.#res.statusCode,
      headers: this.#res.getHeaders(),
      body: undefined,
    });
  }

  #endedEarly(): void {
    if (this.#decided) return;
    this.#decided = true;
    this.#chunks.length = 0;
    void this.execution.endedEarly(this.#res.statusCode, this.#res.getHeaders());
  }
}

/**
 * Whether the client closed the connection (its end of the socket ended or reset), as opposed to this server
 * closing it (a framework destroying the socket after a handler failed mid-response, a server timeout).
 */
export function closedByClient(socket: { readableEnded: boolean; errored?: Error | null } | null): boolean {
  return socket === null || socket.readableEnded || (socket.errored ?? null) !== null;
}

/** What `readUpTo` read of a body stream. */
export interface ReadUpTo {
  /** The chunks read, as bytes. */
  readonly chunks: Buffer[];
  /** Their length in bytes. */
  readonly size: number;
  /** The unread rest when the body went over the limit; `undefined` when the stream ended within it. */
  readonly rest: AsyncIterator<unknown> | undefined;
}

/**
 * Reads a body stream (a framework's stream payload) until its end, or until more than `limit` bytes are read:
 * then `rest` is the unread remainder, to stream through. The iterator is driven by hand, not with `for await`,
 * since leaving a `for await` early destroys the stream.
 */
export async function readUpTo(source: AsyncIterator<unknown>, limit: number): Promise<ReadUpTo> {
  const chunks: Buffer[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await source.next();
    if (done) return { chunks, size, rest: undefined };
    const chunk = toChunk(value);
    chunks.push(chunk);
    size += chunk.byteLength;
    if (size > limit) return { chunks, size, rest: source };
  }
}

/** A chunk of a body stream as bytes; a stream that yields anything but bytes or a string cannot be sent. */
export function toChunk(value: unknown): Buffer {
  if (Buffer.isBuffer(value)) return value;
  if (typeof value === 'string') return Buffer.from(value);
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  throw new TypeError(
    `oncely: a response stream gave a ${typeof value} chunk; only bytes and strings can be sent`,
  );
}
