import { httpBehaviourSuite } from '@oncely/testing';
import { webHarness } from './harness';

httpBehaviourSuite(webHarness('@oncely/web (MemoryStore)'));
