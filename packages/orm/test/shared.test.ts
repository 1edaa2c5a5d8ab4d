import { IdempotencySetupError } from '@oncely/core';
import type { SqlTransactions } from '@oncely/core/adapter';
import { ormTransactions, splitPlaceholders } from '../src/shared';

describe('splitPlaceholders', () => {
  test('PostgreSQL: a parameter used twice is bound twice, in the order placeholders occur', () => {
    expect(
      splitPlaceholders('postgres', 'SELECT $2::text, $1 WHERE k = $1 AND $10 > 0', [...'abcdefghij']),
    ).toEqual({
      chunks: ['SELECT ', '::text, ', ' WHERE k = ', ' AND ', ' > 0'],
      values: ['b', 'a', 'a', 'j'],
    });
  });

  test('PostgreSQL: $n inside literals, quoted identifiers, dollar quotes and comments is text', () => {
    const statement = `SELECT '$1', "a$1", $$ $1 $$, $q$ $2 $q$, E'\\' $1', 'it''s $1' -- $1
      /* $2 */ FROM t WHERE x = $2`;
    const { chunks, values } = splitPlaceholders('postgres', statement, ['one', 'two']);
    expect(values).toEqual(['two']);
    expect(chunks.join('?')).toBe(statement.replace(/\$2$/, '?'));
  });

  test('MySQL: each ? takes the next parameter; ? in literals, identifiers and comments is text', () => {
    const statement = 'SELECT ?, \'?\', "\\"?", `?`, ? # ?\n -- ?\n /* ? */ FROM t WHERE k = ?';
    const { chunks, values } = splitPlaceholders('mysql', statement, [1, 2, 3]);
    expect(values).toEqual([1, 2, 3]);
    expect(chunks).toHaveLength(4);
    expect(chunks[0]).toBe('SELECT ');
    expect(chunks[3]).toBe('');
    expect(chunks.join('?')).toBe(statement);
  });

  test('a placeholder without a parameter throws, rather than bind undefined', () => {
    expect(() => splitPlaceholders('postgres', 'SELECT $3', [1, 2])).toThrow(RangeError);
    expect(() => splitPlaceholders('postgres', 'SELECT $0', [1])).toThrow(RangeError);
    expect(() => splitPlaceholders('mysql', 'SELECT ?, ?', [1])).toThrow(RangeError);
  });

  test('a statement without placeholders is one chunk', () => {
    expect(splitPlaceholders('postgres', 'COMMIT', [])).toEqual({ chunks: ['COMMIT'], values: [] });
  });
});

describe('ormTransactions', () => {
  const parts: SqlTransactions<{ tx: number }> = {
    dialect: 'postgres',
    run: async (work) => work({ tx: 1 }),
    query: async () => ({ rows: [], rowCount: 0 }),
  };

  test('keeps the parts and hands back the request’s transaction', async () => {
    const transactions = ormTransactions('@oncely/orm/test', parts);
    expect(transactions.dialect).toBe('postgres');
    expect(transactions.run).toBe(parts.run);
    expect(transactions.query).toBe(parts.query);
    const tx = { tx: 2 };
    expect(transactions.transactionOf({ idempotency: { db: tx } })).toBe(tx);
  });

  test('a request without a transaction gets a setup error naming the library', () => {
    const transactions = ormTransactions('@oncely/orm/test', parts);
    const without = () => transactions.transactionOf({ idempotency: undefined });
    expect(without).toThrow(IdempotencySetupError);
    expect(without).toThrow(/@oncely\/orm\/test.*transactional: true/);
  });
});
