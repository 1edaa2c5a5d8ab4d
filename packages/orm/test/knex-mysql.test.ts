/**
 * @services mariadb
 */
import { join } from 'node:path';
import { ormSuite } from '@oncely/testing';

jest.setTimeout(30_000);

ormSuite(join(__dirname, 'targets', 'knex-mysql.ts'));
