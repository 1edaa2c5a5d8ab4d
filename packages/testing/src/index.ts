export {
  type CommandProcess,
  repositoryRoot,
  runRootScript,
  runRootScriptToEnd,
} from './commands';
export { type CommitCut, type CommitCutter, startCommitCutter } from './commit-cutter';
export {
  type ConsumerProcess,
  type ResumingDelivery,
  resumingWork,
  sleep,
  startConsumerProcess,
  waitUntil,
} from './consumers';
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
export { type StepsAnswer, stepsRoute } from './http-suite-steps';
export { mariadbBinary, type PrivateMariadb, startMariadbServer } from './mariadb-server';
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
  loadOrmTarget,
  type OrmOrderBody,
  type OrmSuiteOptions,
  type OrmSuiteRequest,
  type OrmSuiteStore,
  type OrmSuiteTarget,
  type OrmSuiteTargetModule,
  type OrmSuiteTargetOptions,
  ormSuite,
  ormSuiteApp,
  ormSuiteId,
} from './orm-suite';
export {
  closeServers,
  expect503,
  expectCommitUnknown,
  type Gate,
  gate,
  gatedRoute,
  killAndRestart,
  listen,
  type OutageApp,
  onceFree,
  servedAfterResume,
  until,
} from './outages';
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
export {
  createTestQueue,
  type SqsServer,
  type SqsServerNode,
  sqsServerNode,
  sqsServerProblem,
  startSqsServer,
  type TestQueue,
  type TestQueueOptions,
} from './sqs-server';
export {
  type ChargeProvider,
  type CrashAnswer,
  checkCharges,
  checkCrashRun,
  checkJournal,
  checkStepEffects,
  expectedKeyFor,
  type JournalEntry,
  type Killable,
  killRepeatedly,
  type ProviderCall,
  type StepEffect,
  startChargeProvider,
} from './steps-crash';
export { type StoreSuiteOptions, storeContractSuite } from './store-suite';
export {
  type TransactionalChargeBody,
  type TransactionalSuiteOptions,
  type TransactionalSuiteRequest,
  type TransactionalSuiteStore,
  type TransactionalSuiteTarget,
  transactionalSuite,
  transactionalSuiteApp,
} from './transactional-suite';
