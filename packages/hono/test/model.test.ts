import { MemoryStore } from '@oncely/core';
import { memoryModelStore, modelSuite } from '@oncely/testing';
import { honoModelApp } from './model-app';

// Random sequences against Hono on a MemoryStore (on Redis: model-redis.test.ts).
// Replay a failure with the seed and path it prints (docs/development.md).
modelSuite('@oncely/hono', honoModelApp, [memoryModelStore(() => new MemoryStore())]);
