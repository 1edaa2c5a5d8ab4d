export {
  type CommandProcess,
  repositoryRoot,
  runRootScript,
  runRootScriptToEnd,
} from './commands';
export { type ConsumerProcess, sleep, startConsumerProcess, waitUntil } from './consumers';
export {
  binaryParser,
  expectLeavingClientReleased,
  fetchHandlerClient,
  gatedStore,
  http1Post,
  http2Post,
  type LeavingClientApp,
  type LeavingClientOptions,
  routeCounts,
  serveTestApp,
  viewOptions,
} from './harness-helpers';
export {
  type AdapterHarness,
  brokenStore,
  expectedBinary,
  expectedStream,
  expectedWebStream,
  httpBehaviourSuite,
  httpSuiteOnRedis,
  type KnownGap,
  type NestedHarness,
  onStore,
  type RedisClientLike,
  recordingLogger,
  type TestApp,
  type TestAppOptions,
  type TestRequest,
} from './http-suite';
export { pipeParams, pipeSource, pipeWebSource, REUSED_BYTES, reusedBuffer } from './http-suite-failures';
export {
  BufferPool,
  delayOf,
  later,
  MODEL_ROUTES,
  type ModelApp,
  type ModelAppFactory,
  type ModelAppOptions,
  ModelRecorder,
  type ModelRoute,
  type ModelRun,
  type ModelSettings,
  type ModelStep,
  type ModelStore,
  memoryModelStore,
  modelOptions,
  modelSettings,
  modelSuite,
  nextChunk,
  RunHandle,
  redisModelStore,
  runSequence,
  scopeOf,
} from './model';
export {
  type AppProcess,
  fireAtOnce,
  type SentRequest,
  type SourceProcess,
  spawnSource,
  startAppProcess,
} from './processes';
export { type PrivateRedisSentinelSet, type SentinelSetOptions, startRedisSentinelSet } from './sentinel';
export {
  freePort,
  type PrivatePostgres,
  type PrivateRedis,
  type PrivateRedisCluster,
  postgresBinary,
  startPostgres,
  startRedis,
  startRedisCluster,
} from './servers';
export { type StoreSuiteOptions, storeContractSuite } from './store-suite';
