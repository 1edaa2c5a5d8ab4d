import { randomBytes } from 'node:crypto';
import mysql from 'mysql2/promise';

export const mysqlUrl = process.env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

/**
 * A pool and table names of this test file's own (`table('x')`), dropped afterwards: tests never touch shared
 * tables.
 */
export function testTables(): {
  pool: () => mysql.Pool;
  table: (name: string) => string;
  drop: () => Promise<void>;
} {
  const prefix = `ot_${randomBytes(5).toString('hex')}_`;
  const made = new Set<string>();
  let pool: mysql.Pool | undefined;
  return {
    pool: () => {
      pool ??= mysql.createPool({ uri: mysqlUrl, connectionLimit: 20 });
      return pool;
    },
    table: (name) => {
      made.add(prefix + name);
      return prefix + name;
    },
    drop: async () => {
      if (pool === undefined) return;
      for (const table of made) await pool.query(`DROP TABLE IF EXISTS \`${table}\``);
      await pool.end();
    },
  };
}
