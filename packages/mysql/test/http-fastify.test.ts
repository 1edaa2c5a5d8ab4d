/**
 * @services mariadb
 */

import type { IdempotencyStore } from '@oncely/core';
import { httpBehaviourSuite, onStore } from '@oncely/testing';
import { fastifyHarness } from '../../fastify/test/harness';
import { MySQLStore } from '../src';
import { testTables } from './helpers';

// The whole HTTP behaviour suite on Fastify, every app on one MySQLStore (a table of this file's own).
const db = testTables();
const store = new MySQLStore({ pool: db.pool(), table: db.table('http_fastify') });
beforeAll(() => store.migrate());
afterAll(() => db.drop());

httpBehaviourSuite(onStore(fastifyHarness, 'MySQLStore', () => store as IdempotencyStore));
