import { MemoryStore } from '@oncely/core';
import { memoryModelStore, modelSuite } from '@oncely/testing';
import { nestModelApp } from './model-app';

// Random sequences against NestJS on both platforms on a MemoryStore (on Redis: model-redis.test.ts).
// Replay a failure with the seed and path it prints (docs/development.md).
modelSuite('NestJS on express', nestModelApp('express'), [memoryModelStore(() => new MemoryStore())]);
modelSuite('NestJS on fastify', nestModelApp('fastify'), [memoryModelStore(() => new MemoryStore())]);
