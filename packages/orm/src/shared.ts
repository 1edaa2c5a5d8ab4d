import { type SqlTransactions, transactionOfRequest } from '@oncely/core/adapter';

/** What a request carries in transactional mode (`req.idempotency`, and each adapter's equivalent). */
export interface TransactionalRequest {
  /** What the adapter attached to a request it covers; absent on a request it does not. */
  idempotency?:
    | {
        /** The request's transaction in transactional mode: the ORM's own transaction object. */
        db: unknown;
      }
    | undefined;
}

/** A `SqlTransactions` for one ORM, with the accessor that hands a handler the ORM's own transaction. */
export interface OrmTransactions<Tx> extends SqlTransactions<Tx> {
  /**
   * The transaction the request holds in transactional mode, typed as the ORM's own. Throws
   * `IdempotencySetupError` if the request is not covered, has no key, or the adapter is not `transactional: true`.
   */
  transactionOf(request: TransactionalRequest): Tx;
}

/**
 * Completes an integration from its three parts: `library` names it in the accessor's error (`'@oncely/orm/knex'`).
 * The parts are copied, so the object a store is given cannot be changed behind it.
 */
export function ormTransactions<Tx>(library: string, parts: SqlTransactions<Tx>): OrmTransactions<Tx> {
  const { dialect, run, query } = parts;
  return {
    dialect,
    run,
    query,
    transactionOf: (request) => transactionOfRequest<Tx>(request, library),
  };
}

/** A statement cut at its placeholders: `chunks.length === values.length + 1`. */
export interface SplitStatement {
  /** The text between placeholders, placeholders removed, in order. */
  chunks: string[];
  /** The value of each placeholder, in the order they occur (a PostgreSQL `$1` used twice appears twice). */
  values: unknown[];
}

/**
 * Cuts a store statement at its placeholders (`$1`…`$n` on PostgreSQL, `?` on MySQL), for libraries that take
 * another form: Knex's `?` with one binding per occurrence, Drizzle's chunks and params. Placeholders inside
 * string literals, quoted identifiers, dollar-quoted bodies and comments are text, not placeholders. Throws on a
 * placeholder with no parameter, so a mistake cannot send `undefined` to the database.
 */
export function splitPlaceholders(
  dialect: 'postgres' | 'mysql',
  statement: string,
  params: readonly unknown[],
): SplitStatement {
  const chunks: string[] = [];
  const values: unknown[] = [];
  let chunk = '';
  let next = 0; // the next `?` parameter (MySQL)
  let i = 0;
  const valueAt = (index: number): unknown => {
    if (index < 0 || index >= params.length)
      throw new RangeError(`placeholder ${index + 1} has no parameter (${params.length} given)`);
    return params[index];
  };
  while (i < statement.length) {
    const c = statement[i] as string;
    const skipped = skipText(dialect, statement, i);
    if (skipped > i) {
      chunk += statement.slice(i, skipped);
      i = skipped;
    } else if (dialect === 'postgres' && c === '$' && /[0-9]/.test(statement[i + 1] ?? '')) {
      let end = i + 1;
      while (/[0-9]/.test(statement[end] ?? '')) end++;
      values.push(valueAt(Number(statement.slice(i + 1, end)) - 1));
      chunks.push(chunk);
      chunk = '';
      i = end;
    } else if (dialect === 'mysql' && c === '?') {
      values.push(valueAt(next++));
      chunks.push(chunk);
      chunk = '';
      i++;
    } else {
      chunk += c;
      i++;
    }
  }
  chunks.push(chunk);
  return { chunks, values };
}

/**
 * If a literal, quoted identifier or comment starts at `i`, the index just past it; otherwise `i`. An unterminated
 * one runs to the end of the statement (the database reports it).
 */
function skipText(dialect: 'postgres' | 'mysql', s: string, i: number): number {
  const c = s[i];
  const untilClose = (close: string, from: number, quote: boolean, backslash = false): number => {
    let j = from;
    while (j < s.length) {
      if (backslash && s[j] === '\\') j += 2;
      else if (s.startsWith(close, j)) {
        // A doubled quote is the quote itself, inside the literal.
        if (quote && s[j + 1] === close) j += 2;
        else return j + close.length;
      } else j++;
    }
    return s.length;
  };
  if (c === "'") {
    // Backslash escapes: always in MySQL literals, in PostgreSQL only in E'...' strings.
    const escaped = dialect === 'mysql' || /(^|[^A-Za-z0-9_$])[eE]$/.test(s.slice(Math.max(0, i - 2), i));
    return untilClose("'", i + 1, true, escaped);
  }
  if (c === '"') return untilClose('"', i + 1, true, dialect === 'mysql');
  if (c === '`' && dialect === 'mysql') return untilClose('`', i + 1, true);
  if (c === '-' && s[i + 1] === '-') return untilClose('\n', i + 2, false);
  if (c === '#' && dialect === 'mysql') return untilClose('\n', i + 1, false);
  if (c === '/' && s[i + 1] === '*') return untilClose('*/', i + 2, false);
  if (c === '$' && dialect === 'postgres') {
    // A dollar quote: `$$` or `$tag$`, closed by the same tag.
    const tag = /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/.exec(s.slice(i, i + 64));
    if (tag !== null) return untilClose(tag[0], i + tag[0].length, false);
  }
  return i;
}
