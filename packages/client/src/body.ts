import { IdempotentFetchBodyTooLargeError, IdempotentFetchOptionsError } from './errors';
/** A body every attempt can send again, byte for byte: the server's fingerprint compares them. */
export type ReplayableBody = Uint8Array<ArrayBuffer> | Blob | null;

/**
 * Turns the request's body into one that can be sent again. A Blob is immutable and is reused as it is. Any other
 * body the caller gave in memory (string, ArrayBuffer, typed array, URLSearchParams, FormData) is encoded once by
 * `template` (so a FormData keeps one multipart boundary) and its bytes reused. A stream (`given`, or the body of a
 * `Request` passed in, or anything else fetch would read as a stream) is read once, up to `maxBodyBytes`; a longer
 * one is refused.
 */
export async function replayableBody(
  template: Request,
  given: unknown,
  maxBodyBytes: number,
  signal: AbortSignal | undefined,
): Promise<ReplayableBody> {
  if (typeof ReadableStream !== 'undefined' && given instanceof ReadableStream)
    return readUpTo(given as ReadableStream<Uint8Array>, maxBodyBytes, signal);
  if (template.body === null) return null;
  if (typeof Blob !== 'undefined' && given instanceof Blob) return given;
  if (inMemory(given)) return new Uint8Array(await template.arrayBuffer());
  return readUpTo(template.body, maxBodyBytes, signal);
}

function inMemory(body: unknown): boolean {
  return (
    typeof body === 'string' ||
    body instanceof ArrayBuffer ||
    ArrayBuffer.isView(body) ||
    (typeof URLSearchParams !== 'undefined' && body instanceof URLSearchParams) ||
    (typeof FormData !== 'undefined' && body instanceof FormData)
  );
}

/** The stream's bytes, or a RangeError as soon as they pass `limit` (the rest is never read). */
async function readUpTo(
  stream: ReadableStream<Uint8Array>,
  limit: number,
  signal: AbortSignal | undefined,
): Promise<Uint8Array<ArrayBuffer>> {
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  // An abort while the caller's stream is slow to produce must not wait for its next chunk.
  const onAbort = () => void reader.cancel(signal?.reason).catch(() => {});
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    for (;;) {
      const { done, value } = await reader.read();
      signal?.throwIfAborted();
      if (done) break;
      if (!ArrayBuffer.isView(value))
        throw new IdempotentFetchOptionsError(
          'body',
          `oncely: a request body stream must produce Uint8Array chunks (as fetch requires); got ${typeof value}`,
        );
      size += value.byteLength;
      if (size > limit) {
        await reader.cancel().catch(() => {});
        throw new IdempotentFetchBodyTooLargeError(
          `oncely: the request body stream is larger than maxBodyBytes (${limit} bytes), so it cannot be kept to ` +
            'send again on a retry; nothing was sent. Raise maxBodyBytes, or pass the body as bytes, a string or a Blob.',
        );
      }
      chunks.push(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
    }
  } finally {
    signal?.removeEventListener('abort', onAbort);
  }
  const bytes = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return bytes;
}
