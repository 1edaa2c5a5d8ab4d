import type { RecordState, RecordView, ResponseView, StepView, StoredRecord } from './backends/types';

/**
 * The key the engine hands the store for a client key: the key alone when the app sets no scope, `<scope> <key>`
 * when it does (a key holds no space, so the last space splits the two).
 */
export function storeKeyOf(key: string, scope: string | undefined): string {
  return scope === undefined ? key : `${scope} ${key}`;
}

/** The client key and scope of a store key (`storeKeyOf`'s inverse). */
export function splitStoreKey(storeKey: string): {
  /** The client's key. */
  key: string;
  /** The app's scope, or undefined for an unscoped key. */
  scope: string | undefined;
} {
  const space = storeKey.lastIndexOf(' ');
  if (space < 0) return { key: storeKey, scope: undefined };
  return { key: storeKey.slice(space + 1), scope: storeKey.slice(0, space) };
}

/** Whether a store key is in `scope` (any key when `scope` is undefined). */
export function inScope(storeKey: string, scope: string | undefined): boolean {
  return scope === undefined || splitStoreKey(storeKey).scope === scope;
}

/** How much of a body or step value a view keeps. */
export const PREVIEW_BYTES = 512;

/** A control character other than tab, newline and carriage return: not text a terminal should print. */
function hasControlCharacter(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if ((c < 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) || c === 0x7f) return true;
  }
  return false;
}

function preview(bytes: Uint8Array): { text: string; encoding: 'utf8' | 'base64' } {
  const head = Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(bytes.byteLength, PREVIEW_BYTES));
  const text = head.toString('utf8');
  // Binary (or text cut inside a character at the end, which a replacement character at the very end shows):
  // base64 is exact, text would not be.
  const body = text.endsWith('\uFFFD') ? text.slice(0, -1) : text;
  if (body.includes('\uFFFD') || hasControlCharacter(body)) {
    return { text: head.toString('base64'), encoding: 'base64' };
  }
  return { text: body, encoding: 'utf8' };
}

function responseView(response: NonNullable<StoredRecord['response']>): ResponseView {
  const { text, encoding } = preview(response.body);
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(response.headers)) {
    if (value !== undefined) headers[name] = Array.isArray(value) ? value.map(String) : String(value);
  }
  return {
    status: response.status,
    headers,
    bodyPreview: text,
    bodyEncoding: encoding,
    bodyBytes: response.body.byteLength,
  };
}

function stepViews(steps: Record<string, string>): StepView[] {
  return Object.entries(steps).map(([name, value]) => {
    const bytes = Buffer.byteLength(value);
    return {
      name,
      preview:
        bytes > PREVIEW_BYTES ? `${Buffer.from(value).subarray(0, PREVIEW_BYTES).toString('utf8')}…` : value,
      bytes,
    };
  });
}

/**
 * The view of a record a store decoded (its `get`): the shared part of every backend, so that each shows a
 * record the same way. `now` is the clock the record's times are read against (the store's where it has one).
 */
export function recordView(
  storeKey: string,
  location: string,
  record: StoredRecord,
  now: number,
  extra: { createdAt?: Date; bytes?: number } = {},
): RecordView {
  const view: RecordView = {
    ...splitStoreKey(storeKey),
    storeKey,
    location,
    state: record.state as RecordState,
  };
  if (record.state !== 'completed' && record.token !== '') view.owner = record.token;
  if (record.state === 'in_progress') view.leaseLeftMs = Math.max(0, record.lockExpiresAt - now);
  if (record.fingerprint !== undefined && record.fingerprint !== '') view.fingerprint = record.fingerprint;
  if (extra.createdAt !== undefined) view.createdAt = extra.createdAt;
  if (Number.isFinite(record.expiresAt) && record.expiresAt > 0) view.expiresAt = new Date(record.expiresAt);
  if (record.steps !== undefined && Object.keys(record.steps).length > 0)
    view.steps = stepViews(record.steps);
  if (record.response !== undefined) view.response = responseView(record.response);
  if (extra.bytes !== undefined) view.bytes = extra.bytes;
  return view;
}

/** An empty count of every state. */
export function noRecords(): Record<RecordState, number> {
  return { in_progress: 0, completed: 0, released: 0 };
}
