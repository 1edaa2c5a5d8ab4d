import { MemoryStore } from '@oncely/core';
import { memoryModelStore, modelSuite } from '@oncely/testing';
import { express4ModelApp, express5ModelApp } from './model-app';

// Random sequences against Express 5 and 4 on a MemoryStore; on Redis: packages/redis/test/model.test.ts.
// Replay a failure with the seed and path it prints (docs/development.md).
modelSuite('Express 5', express5ModelApp, [memoryModelStore(() => new MemoryStore())]);
modelSuite('Express 4', express4ModelApp, [memoryModelStore(() => new MemoryStore())]);
