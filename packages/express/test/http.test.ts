import { httpBehaviourSuite } from '@oncely/testing';
import express from 'express';
import express4 from 'express4';
import { expressHarness } from './harness';

httpBehaviourSuite(expressHarness('Express 5', express));
httpBehaviourSuite(expressHarness('Express 4', express4 as unknown as typeof express));
