/**
 * @services mariadb
 */
import { join } from 'node:path';
import { ormSuite } from '@oncely/testing';

// Generous: the 500-request test takes 10-20 s on a busy 2-core machine.
jest.setTimeout(60_000);

ormSuite(join(__dirname, 'targets', 'drizzle-mysql.ts'));
