import { openSqlTransaction, type SqlTransactions } from '../src/adapter';

/** A library whose transactions are callbacks, recording how each ended. */
function library(options: { failCommit?: boolean; skipWork?: boolean } = {}) {
  const ends: string[] = [];
  const transactions: SqlTransactions<{ id: number }> = {
    dialect: 'postgres',
    async run(work) {
      if (options.skipWork) return;
      try {
        await work({ id: 1 });
      } catch (error) {
        ends.push('rollback');
        throw error;
      }
      if (options.failCommit) {
        ends.push('commit failed');
        throw new Error('serialization failure');
      }
      ends.push('commit');
    },
    query: async () => ({ rows: [], rowCount: 0 }),
  };
  return { transactions, ends };
}

test('end(true) commits and end(false) rolls back, each once the library has finished', async () => {
  const a = library();
  const open = await openSqlTransaction(a.transactions);
  expect(open.tx).toEqual({ id: 1 });
  await open.end(true);
  expect(a.ends).toEqual(['commit']);
  const b = library();
  await (await openSqlTransaction(b.transactions)).end(false);
  expect(b.ends).toEqual(['rollback']);
});

test('a failed commit rejects with the library’s error; a rollback never rejects', async () => {
  const open = await openSqlTransaction(library({ failCommit: true }).transactions);
  await expect(open.end(true)).rejects.toThrow('serialization failure');
  const again = await openSqlTransaction(library({ failCommit: true }).transactions);
  await expect(again.end(false)).resolves.toBeUndefined();
});

test('a run that resolves without running its work rejects instead of hanging', async () => {
  await expect(openSqlTransaction(library({ skipWork: true }).transactions)).rejects.toThrow(
    /without running/,
  );
});
