/** Why a key header was refused; the engine turns it into a 400 problem. */
export type KeyProblem = 'empty' | 'too-long' | 'not-visible-ascii' | 'malformed-string' | 'multiple-values';

// Visible ASCII (0x21–0x7E), the only characters a key may hold once unquoted.
const VISIBLE_ASCII = /^[\x21-\x7e]+$/;

/**
 * Reads an Idempotency-Key header value: a plain token (`abc`) or an RFC 8941 sf-string (`"abc"`, where only
 * `\"` and `\\` escapes are allowed). Both spellings of the same key name the same record. Returns the key, or
 * the reason it is refused.
 */
export function parseKey(
  raw: string | readonly string[],
  maxLength: number,
):
  | string
  | {
      /** Why the key is refused. */
      problem: KeyProblem;
    } {
  if (typeof raw !== 'string') return { problem: 'multiple-values' };
  // Cheap bound before any work: a quoted key can at most double in size through escapes.
  if (raw.length > 2 * maxLength + 16) return { problem: 'too-long' };
  let key = trimOws(raw);
  if (key.charCodeAt(0) === 34 /* " */) {
    const unquoted = unquote(key);
    if (unquoted === undefined) return { problem: 'malformed-string' };
    key = unquoted;
  }
  if (key.length === 0) return { problem: 'empty' };
  if (key.length > maxLength) return { problem: 'too-long' };
  if (!VISIBLE_ASCII.test(key)) return { problem: 'not-visible-ascii' };
  return key;
}

/**
 * Drops the optional whitespace around a field value (SP and HTAB, RFC 9110, section 5.6.3), and nothing else: `trim()`
 * also drops NBSP, vertical tab and Unicode spaces, which would turn a refused key into an accepted one.
 */
function trimOws(value: string): string {
  let start = 0;
  let end = value.length;
  while (start < end && isOws(value.charCodeAt(start))) start++;
  while (end > start && isOws(value.charCodeAt(end - 1))) end--;
  return start === 0 && end === value.length ? value : value.slice(start, end);
}

function isOws(code: number): boolean {
  return code === 0x20 || code === 0x09;
}

/** RFC 8941 sf-string (section 4.2.5) parsing; `undefined` when the value is not exactly one well-formed string. */
function unquote(value: string): string | undefined {
  let out = '';
  for (let i = 1; i < value.length; i++) {
    const code = value.charCodeAt(i);
    if (code === 92 /* \ */) {
      const next = value.charCodeAt(++i);
      if (next !== 34 && next !== 92) return undefined;
      out += value[i];
    } else if (code === 34) {
      return i === value.length - 1 ? out : undefined;
    } else if (code < 0x20 || code > 0x7e) {
      return undefined;
    } else {
      out += value[i];
    }
  }
  return undefined; // no closing quote
}
