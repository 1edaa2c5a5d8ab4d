import { MemoryStore } from '@oncely/core';
import { memoryModelStore, modelSuite } from '@oncely/testing';
import { koaModelApp } from './model-app';

// Random sequences against Koa on a MemoryStore (on Redis: model-redis.test.ts).
// Replay a failure with the seed and path it prints (docs/development.md).
modelSuite('@oncely/koa', koaModelApp, [memoryModelStore(() => new MemoryStore())]);
