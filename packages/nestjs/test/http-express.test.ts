import { httpBehaviourSuite } from '@oncely/testing';
import { nestHarness } from './harness';

httpBehaviourSuite(nestHarness('NestJS on Express (MemoryStore)', 'express'));
