/**
 * @services mariadb
 */

import type { IdempotencyStore } from '@oncely/core';
import { httpBehaviourSuite, onStore } from '@oncely/testing';
import express from 'express';
import { expressHarness } from '../../express/test/harness';
import { MySQLStore } from '../src';
import { testTables } from './helpers';

// The whole HTTP behaviour suite on Express 5, every app on one MySQLStore (a table of this file's own).
const db = testTables();
const store = new MySQLStore({ pool: db.pool(), table: db.table('http_express') });
beforeAll(() => store.migrate());
afterAll(() => db.drop());

httpBehaviourSuite(
  onStore(expressHarness('Express 5', express), 'MySQLStore', () => store as IdempotencyStore),
);
