import { httpBehaviourSuite } from '@oncely/testing';
import { koaHarness } from './harness';

httpBehaviourSuite(koaHarness('@oncely/koa (MemoryStore)'));
