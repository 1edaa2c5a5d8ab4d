import { MemoryStore } from '@oncely/core';
import { memoryModelStore, modelSuite } from '@oncely/testing';
import { webModelApp } from './model-app';

// Random sequences against @oncely/web on a MemoryStore (on Redis: model-redis.test.ts).
// Replay a failure with the seed and path it prints (docs/development.md).
modelSuite('@oncely/web', webModelApp, [memoryModelStore(() => new MemoryStore())]);
