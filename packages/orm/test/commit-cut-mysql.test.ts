/**
 * @services mariadb
 */
import { commitCutSuite } from './commit-cut';

jest.setTimeout(30_000);

commitCutSuite('mysql', 'MYSQL_URL', 'mysql://root@127.0.0.1:3306/test', [
  'knex-mysql',
  'drizzle-mysql',
  'kysely-mysql',
  'typeorm-mysql',
  'prisma-mariadb',
]);
