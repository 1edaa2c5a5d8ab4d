import { httpBehaviourSuite } from '@oncely/testing';
import { nestHarness } from './harness';

httpBehaviourSuite(nestHarness('NestJS on Fastify (MemoryStore)', 'fastify'));
