/**
 * @services postgres mariadb
 */
import { randomBytes } from 'node:crypto';
import type { SqlTransactions } from '@oncely/core/adapter';
import { knexTransactions } from '@oncely/orm/knex';
import { typeormTransactions } from '@oncely/orm/typeorm';
import knexFactory, { type Knex } from 'knex';
import { DataSource, type EntityManager } from 'typeorm';

// What the stores rely on from `query` and `run`, on each ORM and database: the row counts of every kind of
// statement, rows back from SELECT and RETURNING, `$n` reused on PostgreSQL, and commit/rollback with the work.
const table = `oncely_orm_shapes_${randomBytes(5).toString('hex')}`;
const pgUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const mysqlUrl = process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

interface Target {
  name: string;
  dialect: 'postgres' | 'mysql';
  transactions: () => SqlTransactions<unknown>;
  raw: (sql: string) => Promise<unknown>;
  /** The ORM's own nested transaction on `tx` (a savepoint), running `work` on the inner transaction. */
  nested: (tx: unknown, work: (inner: unknown) => Promise<void>) => Promise<void>;
  close: () => Promise<void>;
}

function knexTarget(client: 'pg' | 'mysql2', url: string, dialect: 'postgres' | 'mysql'): Target {
  let db: Knex | undefined;
  const open = () => {
    db ??= knexFactory({ client, connection: url, pool: { min: 0, max: 4 } });
    return db;
  };
  return {
    name: `knex ${client}`,
    dialect,
    transactions: () => knexTransactions(open()) as SqlTransactions<unknown>,
    raw: (sql) => open().raw(sql),
    nested: (tx, work) => (tx as Knex.Transaction).transaction(work),
    close: async () => {
      await db?.destroy();
    },
  };
}

function typeormTarget(type: 'postgres' | 'mariadb', url: string, dialect: 'postgres' | 'mysql'): Target {
  const dataSource = new DataSource({ type, url, poolSize: 4 });
  return {
    name: `typeorm ${type}`,
    dialect,
    transactions: () => typeormTransactions(dataSource) as SqlTransactions<unknown>,
    nested: (tx, work) => (tx as EntityManager).transaction(work),
    raw: async (sql) => {
      if (!dataSource.isInitialized) await dataSource.initialize();
      return dataSource.query(sql);
    },
    close: async () => {
      if (dataSource.isInitialized) await dataSource.destroy();
    },
  };
}

const targets: Target[] = [
  knexTarget('pg', pgUrl, 'postgres'),
  knexTarget('mysql2', mysqlUrl, 'mysql'),
  typeormTarget('postgres', pgUrl, 'postgres'),
  typeormTarget('mariadb', mysqlUrl, 'mysql'),
];

test('the integrations run at the isolation level given', async () => {
  const dataSource = new DataSource({ type: 'postgres', url: pgUrl, poolSize: 1 });
  await dataSource.initialize();
  const db = knexFactory({ client: 'pg', connection: pgUrl, pool: { min: 0, max: 1 } });
  try {
    const levels: unknown[] = [];
    const all = [
      typeormTransactions(dataSource),
      typeormTransactions(dataSource, { isolationLevel: 'SERIALIZABLE' }),
      knexTransactions(db),
      knexTransactions(db, { isolationLevel: 'repeatable read' }),
    ] as SqlTransactions<unknown>[];
    for (const transactions of all) {
      await transactions.run(async (tx) => {
        const { rows } = await transactions.query(tx, 'SHOW transaction_isolation', []);
        levels.push(rows[0]?.transaction_isolation);
      });
    }
    expect(levels).toEqual(['read committed', 'serializable', 'read committed', 'repeatable read']);
  } finally {
    await dataSource.destroy();
    await db.destroy();
  }
});

test('the integrations refuse a database they do not support', () => {
  // CockroachDB speaks through pg, but its SQL differs: refused rather than assumed to be PostgreSQL.
  const cockroach = knexFactory({ client: 'cockroachdb' });
  expect(() => knexTransactions(cockroach)).toThrow(/client 'cockroachdb' is not supported/);
  const cockroachSource = new DataSource({ type: 'cockroachdb', timeTravelQueries: false });
  expect(() => typeormTransactions(cockroachSource)).toThrow(/type 'cockroachdb' is not supported/);
});

describe.each(targets)('$name', (target) => {
  const p = (n: number) => (target.dialect === 'postgres' ? `$${n}` : '?');
  let transactions: SqlTransactions<unknown>;

  beforeAll(async () => {
    // TypeORM needs its data source initialized before `transactions` is built from it.
    await target.raw(`DROP TABLE IF EXISTS ${table}`);
    await target.raw(
      `CREATE TABLE ${table} (k VARCHAR(64) PRIMARY KEY, n INT NOT NULL, b ${target.dialect === 'postgres' ? 'BYTEA' : 'BLOB'})`,
    );
    transactions = target.transactions();
  });
  afterAll(async () => {
    await target.raw(`DROP TABLE IF EXISTS ${table}`);
    await target.close();
  });

  it('names the database it talks to', () => {
    expect(transactions.dialect).toBe(target.dialect);
  });

  it('counts the rows of INSERT, UPDATE, DELETE and SELECT, and returns SELECT rows', async () => {
    await transactions.run(async (tx) => {
      const insert =
        target.dialect === 'postgres'
          ? await transactions.query(
              tx,
              `INSERT INTO ${table} (k, n, b) VALUES ($1, $2, $3), ($4, $2, NULL)`,
              ['a', 1, Buffer.from([1, 2]), 'b'],
            )
          : await transactions.query(tx, `INSERT INTO ${table} (k, n, b) VALUES (?, ?, ?), (?, ?, NULL)`, [
              'a',
              1,
              Buffer.from([1, 2]),
              'b',
              1,
            ]);
      expect(insert).toEqual({ rows: [], rowCount: 2 });
      const update = await transactions.query(tx, `UPDATE ${table} SET n = n + 1 WHERE n = ${p(1)}`, [1]);
      expect(update).toEqual({ rows: [], rowCount: 2 });
      const none = await transactions.query(tx, `UPDATE ${table} SET n = 0 WHERE k = ${p(1)}`, ['missing']);
      expect(none.rowCount).toBe(0);
      const select = await transactions.query(tx, `SELECT k, n, b FROM ${table} ORDER BY k`, []);
      expect(select.rowCount).toBe(2);
      expect(select.rows.map((row) => [row.k, Number(row.n)])).toEqual([
        ['a', 2],
        ['b', 2],
      ]);
      expect(Buffer.from(select.rows[0]?.b as Uint8Array)).toEqual(Buffer.from([1, 2]));
      const remove = await transactions.query(tx, `DELETE FROM ${table} WHERE k = ${p(1)}`, ['b']);
      expect(remove).toEqual({ rows: [], rowCount: 1 });
    });
    const after = (await target.raw(`SELECT count(*) AS c FROM ${table}`)) as unknown;
    expect(JSON.stringify(after)).toContain('1');
  });

  it('commits the work, and rolls it back when the work rejects', async () => {
    await transactions.run(async (tx) => {
      await transactions.query(tx, `INSERT INTO ${table} (k, n) VALUES (${p(1)}, ${p(2)})`, ['kept', 7]);
    });
    const failure = new Error('handler failed');
    await expect(
      transactions.run(async (tx) => {
        await transactions.query(tx, `INSERT INTO ${table} (k, n) VALUES (${p(1)}, ${p(2)})`, ['lost', 8]);
        throw failure;
      }),
    ).rejects.toBe(failure);
    await transactions.run(async (tx) => {
      const { rows } = await transactions.query(
        tx,
        `SELECT k FROM ${table} WHERE k IN (${p(1)}, ${p(2)}) ORDER BY k`,
        ['kept', 'lost'],
      );
      expect(rows.map((row) => row.k)).toEqual(['kept']);
    });
  });

  it('makes a nested transaction of the ORM a savepoint: its rollback keeps the outer writes', async () => {
    await transactions.run(async (tx) => {
      await transactions.query(tx, `INSERT INTO ${table} (k, n) VALUES (${p(1)}, 1)`, ['outer']);
      await expect(
        target.nested(tx, async (inner) => {
          await transactions.query(inner, `INSERT INTO ${table} (k, n) VALUES (${p(1)}, 1)`, ['inner']);
          throw new Error('inner failed');
        }),
      ).rejects.toThrow('inner failed');
      await target.nested(tx, async (inner) => {
        await transactions.query(inner, `INSERT INTO ${table} (k, n) VALUES (${p(1)}, 1)`, ['inner-kept']);
      });
    });
    await transactions.run(async (tx) => {
      const { rows } = await transactions.query(
        tx,
        `SELECT k FROM ${table} WHERE k LIKE 'inner%' OR k = 'outer' ORDER BY k`,
        [],
      );
      expect(rows.map((row) => row.k)).toEqual(['inner-kept', 'outer']);
    });
  });

  if (target.dialect === 'postgres') {
    it('binds a reused $n each time and leaves a literal ? alone (PostgreSQL)', async () => {
      await transactions.run(async (tx) => {
        const { rows, rowCount } = await transactions.query(
          tx,
          `INSERT INTO ${table} (k, n) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET n = $2 + 1 RETURNING k, n, '{"a":1}'::jsonb ? 'a' AS has, $1 AS again`,
          ['reused', 5],
        );
        expect(rowCount).toBe(1);
        expect(rows).toEqual([{ k: 'reused', n: 5, has: true, again: 'reused' }]);
      });
    });
  }
});
