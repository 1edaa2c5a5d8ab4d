import { Readable } from 'node:stream';
import type { Execution } from '../http/execution';
import type { OutgoingHeaderValue } from '../http/headers';
import { InvalidValueError } from '../shared/errors';
import type { StoredResponse } from '../stores/store';

/** What the capture reads of a Node response (`http.ServerResponse`, `Http2ServerResponse`) when it settles. */
export interface NodeResponseHead {
  /** The status the response is sent with. */
  readonly statusCode: number;
  /** The headers set on the response so far. */
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
  /** The execution that owns the request's key, which the capture settles. */
  readonly execution: Execution;
  readonly #res: NodeResponseHead;
  #chunks: Buffer[] = [];
  #size = 0;
  #streaming = false;
  #begun = false;
  #clientLeft = false;
  #decided = false;
  /** The answer's status and headers as sent, once the rest of a body over the limit streams (`sendRest`). */
  #sent: { status: number; headers: Readonly<Record<string, OutgoingHeaderValue>> } | undefined;
  /** Stops reading the source of a body over the limit that streams (`sendRest`). */
  #stop: (() => void) | undefined;

  /** Captures the body of `res`, the response of the request `execution` runs. */
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
    if (chunks.length === 1) return chunks[0] as Buffer;
    return chunks.length === 0 ? EMPTY : Buffer.concat(chunks, this.#size);
  }

  /**
   * Holds a body stream (a framework's stream payload) until its end, or until it goes over the limit: then
   * returns the unread rest, to send after what is held (`sendRest`); `undefined` when all of it is held. The
   * iterator is driven by hand, not with `for await`, since leaving a `for await` early destroys the stream.
   */
  async holdStream(source: AsyncIterator<unknown>): Promise<AsyncIterator<unknown> | undefined> {
    for (;;) {
      const { done, value } = await source.next();
      if (done) return undefined;
      if (!this.hold(toChunk(value))) return source;
    }
  }

  /**
   * The body over the limit, as a stream to hand the framework: what is held, then the rest of the source. Its end
   * stores the answer with its status only; a source that fails is a failed handler (the key is released, and the
   * error goes on to the stream); the stream closed before its end, read or not (the client left, the framework
   * dropped it), is `cutShort`. `status` and `headers` are the answer's as the framework sends it; `stop` stops
   * reading the source.
   */
  sendRest(
    rest: AsyncIterator<unknown>,
    status: number,
    headers: Readonly<Record<string, OutgoingHeaderValue>>,
    stop: () => void,
  ): Readable {
    this.#sent = { status, headers };
    this.#stop = stop;
    this.#begun = true;
    const held = this.drain();
    const failed = (error: unknown): void => {
      // Decided already when the stream was cut short or dropped: stopping the source makes it fail.
      if (!this.#decided) void this.failed(error);
      body.destroy(error instanceof Error ? error : new Error(String(error)));
    };
    const body = new Readable({
      read: () => {
        const chunk = held.shift();
        if (chunk !== undefined) {
          body.push(chunk);
          return;
        }
        rest.next().then(({ done, value }) => {
          if (done) {
            // Stored before the stream ends, so a retry once the answer arrived finds it.
            if (this.#decided) body.push(null);
            else this.finished(status, headers, undefined).then(() => body.push(null), failed);
            return;
          }
          // toChunk throws for a chunk that is neither bytes nor a string: the stream fails, not the promise.
          let next: Buffer;
          try {
            next = toChunk(value);
          } catch (error) {
            failed(error);
            return;
          }
          this.passed(next);
          body.push(next);
        }, failed);
      },
      // Destroyed before its end, read or not (the client left, the framework dropped it): decided at once.
      destroy: (error, callback) => {
        this.cutShort();
        callback(error);
      },
    });
    return body;
  }

  /**
   * The framework sends another answer instead of the body that streams (its error answer, say): the source is no
   * longer read, and this capture decides nothing more; the adapter captures the new answer afresh.
   */
  dropRest(): void {
    this.#decided = true;
    this.#chunks.length = 0;
    this.#stop?.();
  }

  /**
   * The answer began and stopped before its end, without an error (the client left while the body streamed, the
   * framework dropped the stream, or the handler's own answer around the adapter never finished): the source is
   * no longer read, and the request is recorded as executed without a body (a retry gets a 410, never a second run).
   */
  cutShort(): void {
    if (this.#decided) return;
    this.#stop?.();
    this.#begun = true;
    this.#clientLeft = true;
    this.#endedEarly();
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
    const sent = this.#sent;
    void (sent === undefined
      ? this.execution.endedEarly(this.#res.statusCode, this.#res.getHeaders())
      : this.execution.endedEarly(sent.status, sent.headers));
  }
}

const EMPTY = Buffer.alloc(0);

/**
 * Whether the client closed the connection (its end of the socket ended or reset), as opposed to this server
 * closing it (a framework destroying the socket after a handler failed mid-response, a server timeout).
 */
export function closedByClient(socket: { readableEnded: boolean; errored?: Error | null } | null): boolean {
  return socket === null || socket.readableEnded || (socket.errored ?? null) !== null;
}

/** A chunk of a body stream as bytes; a stream that yields anything but bytes or a string cannot be sent. */
export function toChunk(value: unknown): Buffer {
  if (Buffer.isBuffer(value)) return value;
  if (typeof value === 'string') return Buffer.from(value);
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  throw new InvalidValueError(
    `oncely: a response stream gave a ${typeof value} chunk; only bytes and strings can be sent`,
  );
}
