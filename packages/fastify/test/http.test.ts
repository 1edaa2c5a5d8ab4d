import { httpBehaviourSuite } from '@oncely/testing';
import { fastifyHarness } from './harness';

httpBehaviourSuite(fastifyHarness);
