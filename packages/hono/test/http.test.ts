import { httpBehaviourSuite } from '@oncely/testing';
import { honoHarness } from './harness';

httpBehaviourSuite(honoHarness('@oncely/hono (MemoryStore)'));
