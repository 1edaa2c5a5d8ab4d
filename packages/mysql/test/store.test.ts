/**
 * @services mariadb
 */

import { storeContractSuite } from '@oncely/testing';
import { MySQLStore } from '../src';
import { testTables } from './helpers';

const db = testTables();

storeContractSuite('MySQLStore', {
  create: async () => {
    const store = new MySQLStore({ pool: db.pool(), table: db.table('suite') });
    await store.migrate();
    return store;
  },
  destroy: () => {}, // the tables and pool outlive the suite: dropped once, below
});

afterAll(() => db.drop());
