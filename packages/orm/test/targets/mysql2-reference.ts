// The ORM suite's reference target on MariaDB/MySQL: plain `mysql2` as the "ORM", through a SqlTransactions built
// here, so the suite and MySQLStore's `transactions` path are proved before any integration lands.
import type { SqlTransactions } from '@oncely/core/adapter';
import { MySQLStore } from '@oncely/mysql';
import type { OrmSuiteTarget, OrmSuiteTargetOptions } from '@oncely/testing';
import mysql from 'mysql2/promise';
import { ormTransactions } from '../../src/shared';

const url = process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

/** Transactions on connections of `pool`, the way an ORM without its own API would offer them. */
export function mysql2Transactions(pool: mysql.Pool): SqlTransactions<mysql.PoolConnection> {
  return {
    dialect: 'mysql',
    run: async (work) => {
      const connection = await pool.getConnection();
      let broken: unknown;
      try {
        await connection.beginTransaction();
        try {
          await work(connection);
        } catch (error) {
          await connection.rollback().catch((rollbackError: unknown) => (broken = rollbackError));
          throw error;
        }
        await connection.commit();
      } finally {
        // A connection whose rollback failed is not handed to the next caller.
        if (broken === undefined) connection.release();
        else connection.destroy();
      }
    },
    query: async (tx, statement, params) => {
      const [result] = await tx.query(statement, params as unknown[]);
      if (Array.isArray(result))
        return { rows: result as Record<string, unknown>[], rowCount: result.length };
      return { rows: [], rowCount: (result as mysql.ResultSetHeader).affectedRows };
    },
  };
}

export async function createTarget({
  id,
}: OrmSuiteTargetOptions): Promise<OrmSuiteTarget<mysql.PoolConnection>> {
  const orders = `ot_${id}_orders`;
  const records = `ot_${id}_idem`;
  const pool = mysql.createPool({ uri: url, connectionLimit: 10 });
  const transactions = ormTransactions('mysql2 (reference)', mysql2Transactions(pool));
  const store = new MySQLStore({ pool, table: records, transactions });
  return {
    name: 'mysql2 on MariaDB (reference)',
    dialect: 'mysql',
    store,
    setup: async () => {
      await store.migrate();
      await pool.query(
        `CREATE TABLE IF NOT EXISTS \`${orders}\` (id INT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(200) NOT NULL, KEY (\`key\`))`,
      );
    },
    insertOrder: async (tx, key) => {
      await tx.query(`INSERT INTO \`${orders}\` (\`key\`) VALUES (?)`, [key]);
    },
    countOrders: async (key) => {
      const [rows] = await pool.query(
        `SELECT count(*) AS n FROM \`${orders}\` WHERE ? IS NULL OR \`key\` = ?`,
        [key ?? null, key ?? null],
      );
      return Number((rows as { n: number }[])[0]?.n ?? 0);
    },
    transactionOf: transactions.transactionOf,
    drop: async () => {
      await pool.query(`DROP TABLE IF EXISTS \`${orders}\`, \`${records}\``);
    },
    close: async () => {
      await store.close();
      await pool.end();
    },
  };
}
