import { MemoryStore } from '@oncely/core';
import { memoryModelStore, modelSuite } from '@oncely/testing';
import { fastifyModelApp } from './model-app';

// Random sequences against Fastify on a MemoryStore; on Redis: packages/redis/test/model.test.ts.
// Replay a failure with the seed and path it prints (docs/development.md).
modelSuite('Fastify 5', fastifyModelApp, [memoryModelStore(() => new MemoryStore())]);
