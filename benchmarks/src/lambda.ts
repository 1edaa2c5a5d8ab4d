// AWS Lambda cold starts: the same API Gateway (HTTP API) function made idempotent with @oncely/lambda +
// DynamoDBStore and with @aws-lambda-powertools/idempotency + DynamoDBPersistenceLayer, bundled with esbuild as a
// Lambda deployment is (minified, platform node), once with the AWS SDK v3 external (the Node.js runtime provides
// it) and once bundled; then the bundle's size, and the time a fresh `node` takes to import it.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { gzipSync } from 'node:zlib';
import { BENCH_DIR } from './child';
import { median } from './results';

/** The handler every variant wraps: the function's own work, the same everywhere. */
const CHARGE = `
const charge = async (event) => {
  const { amount } = JSON.parse(event.body ?? '{}');
  return { statusCode: 201, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ id: 'ch_1', amount }) };
};`;

/** The functions measured, as their source (one module each, what a user's `index.mjs` would hold). */
export const FUNCTIONS = {
  /** No idempotency and no SDK: the floor. */
  bare: `${CHARGE}
export const handler = charge;`,
  /** No idempotency, a DynamoDB client: what the SDK alone costs a function that already talks to DynamoDB. */
  'sdk-only': `import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
${CHARGE}
const client = new DynamoDBClient({});
export const handler = async (event) => { void client; return charge(event); };`,
  oncely: `import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBStore } from '@oncely/dynamodb';
import { withIdempotency } from '@oncely/lambda';
${CHARGE}
const store = new DynamoDBStore({ client: new DynamoDBClient({}), tableName: 'idempotency' });
export const handler = withIdempotency(charge, { store });`,
  /** Each library without the SDK or a client library: what its own code costs (a store in memory, a stub client). */
  'oncely-alone': `import { withIdempotency } from '@oncely/lambda';
${CHARGE}
export const handler = withIdempotency(charge);`,
  'powertools-alone': `import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';
${CHARGE}
const client = { get: async () => null, set: async () => 'OK', del: async () => 0 };
const persistenceStore = new CachePersistenceLayer({ client });
const config = new IdempotencyConfig({ eventKeyJmesPath: 'headers."idempotency-key"' });
export const handler = makeIdempotent(charge, { persistenceStore, config });`,
  powertools: `import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';
${CHARGE}
const persistenceStore = new DynamoDBPersistenceLayer({ tableName: 'idempotency' });
const config = new IdempotencyConfig({ eventKeyJmesPath: 'headers."idempotency-key"' });
export const handler = makeIdempotent(charge, { persistenceStore, config });`,
} as const;

export type FunctionName = keyof typeof FUNCTIONS;

/** Functions without the SDK: their two bundles are the same, so they are timed once (as 'none'). */
const WITHOUT_SDK: ReadonlySet<FunctionName> = new Set(['bare', 'oncely-alone', 'powertools-alone']);
export type SdkMode = 'external' | 'bundled';

export interface BundleSize {
  fn: FunctionName;
  sdk: SdkMode;
  bytes: number;
  gzipBytes: number;
}

export interface ImportTime {
  fn: FunctionName;
  sdk: SdkMode;
  /** Whole process (`node bundle.mjs`, hyperfine or a spawn loop): median and quartiles, ms. */
  process: Spread;
  /** `await import(bundle)` inside a fresh process, measured around the import alone, ms. */
  importOnly: Spread;
}

export interface Spread {
  runs: number;
  median: number;
  p25: number;
  p75: number;
  min: number;
  max: number;
}

export interface LambdaColdStart {
  /** ISO date of the run. */
  date?: string;
  esbuild: string;
  versions: Record<string, string>;
  runs: number;
  /** `hyperfine <version>`, or 'spawn loop' when hyperfine is not installed. */
  timer: string;
  /** Process time of `node empty.mjs`, for reading the process column. */
  nodeAlone: Spread;
  sizes: BundleSize[];
  imports: ImportTime[];
  /** The 1-minute load average when the timing started and when it ended (other work on the machine). */
  loadAverage?: [number, number];
  /** Variants that could not be built or imported, and why (e.g. a wrapper not built yet). */
  failures: string[];
}

const OUT = join(BENCH_DIR, 'results', 'lambda');
const requireHere = createRequire(join(BENCH_DIR, 'package.json'));

function spread(values: number[]): Spread {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number;
  return {
    runs: sorted.length,
    median: median(sorted),
    p25: at(0.25),
    p75: at(0.75),
    min: sorted[0] as number,
    max: sorted[sorted.length - 1] as number,
  };
}

function versionOf(name: string): string {
  const main = requireHere.resolve(name);
  let dir = dirname(main);
  for (;;) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === name && pkg.version !== undefined) return pkg.version;
    } catch {}
    const up = dirname(dir);
    if (up === dir) return 'unknown';
    dir = up;
  }
}

function hyperfineVersion(): string | undefined {
  try {
    return execFileSync('hyperfine', ['--version'], { encoding: 'utf8' }).trim();
  } catch {
    return undefined;
  }
}

/** The external SDK resolves from the bundle's directory as on the Lambda runtime: a node_modules beside it. */
function linkSdk(dir: string): void {
  const modules = join(dir, 'node_modules', '@aws-sdk');
  mkdirSync(modules, { recursive: true });
  for (const name of ['client-dynamodb', 'util-dynamodb']) {
    const pkg = requireHere.resolve(`@aws-sdk/${name}`);
    // …/node_modules/@aws-sdk/<name>/dist-cjs/index.js → …/node_modules/@aws-sdk/<name>
    const root = pkg.slice(0, pkg.indexOf(`@aws-sdk/${name}`) + `@aws-sdk/${name}`.length);
    symlinkSync(root, join(modules, name), 'dir');
  }
}

async function build(fn: FunctionName, sdk: SdkMode, dir: string): Promise<string> {
  const esbuild = requireHere('esbuild') as typeof import('esbuild');
  const source = join(dir, `${fn}.src.mjs`);
  writeFileSync(source, FUNCTIONS[fn]);
  const outfile = join(dir, `${fn}.mjs`);
  await esbuild.build({
    entryPoints: [source],
    outfile,
    bundle: true,
    minify: true,
    platform: 'node',
    target: 'node20',
    format: 'esm',
    // Resolve packages from benchmarks/, whose dependencies hold both libraries and the SDK.
    nodePaths: [join(BENCH_DIR, 'node_modules')],
    mainFields: ['module', 'main'],
    external: sdk === 'external' ? ['@aws-sdk/*', '@smithy/*'] : [],
    // CommonJS dependencies bundled into ESM call require() for Node's built-ins.
    banner: {
      js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);",
    },
    logLevel: 'silent',
    legalComments: 'none',
  });
  return outfile;
}

function timeProcessHyperfine(files: string[], runs: number, warmup: number, jsonFile: string): number[][] {
  execFileSync(
    'hyperfine',
    [
      '--style',
      'none',
      '--warmup',
      String(warmup),
      '--runs',
      String(runs),
      '--export-json',
      jsonFile,
      ...files.map((f) => `${process.execPath} ${f}`),
    ],
    { stdio: 'ignore', env: { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' } },
  );
  const report = JSON.parse(readFileSync(jsonFile, 'utf8')) as { results: { times: number[] }[] };
  return report.results.map((r) => r.times.map((t) => t * 1000));
}

function timeProcessLoop(files: string[], runs: number): number[][] {
  const times = files.map(() => [] as number[]);
  for (let i = 0; i < runs; i++)
    files.forEach((file, j) => {
      const start = process.hrtime.bigint();
      const r = spawnSync(process.execPath, [file], { stdio: 'ignore' });
      if (r.status !== 0) throw new Error(`node ${file} exited with ${r.status}`);
      times[j]?.push(Number(process.hrtime.bigint() - start) / 1e6);
    });
  return times;
}

/** One fresh process per sample, the variants taking turns so that the machine's load falls on all alike. */
function timeImports(files: string[], runs: number, dir: string): number[][] {
  const timer = join(dir, 'import-timer.mjs');
  writeFileSync(
    timer,
    `const t = performance.now(); await import(process.argv[2]); console.log(performance.now() - t);`,
  );
  const times = files.map(() => [] as number[]);
  for (let i = 0; i < runs; i++)
    files.forEach((file, j) => {
      const r = spawnSync(process.execPath, [timer, pathToFileURL(file).href], {
        encoding: 'utf8',
        env: { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' },
      });
      if (r.status !== 0)
        throw new Error(`importing ${file} failed: ${r.stderr.trim().split('\n').slice(-3).join(' ')}`);
      times[j]?.push(Number(r.stdout.trim()));
    });
  return times;
}

export async function measureLambdaColdStart(options: {
  runs: number;
  /** Untimed runs of each process before the timed ones (hyperfine's --warmup). Default 3. */
  warmup?: number;
  functions?: FunctionName[];
  log?: (line: string) => void;
}): Promise<LambdaColdStart> {
  const log = options.log ?? (() => {});
  const fns = options.functions ?? (Object.keys(FUNCTIONS) as FunctionName[]);
  rmSync(OUT, { recursive: true, force: true });
  const failures: string[] = [];
  const sizes: BundleSize[] = [];
  const built: { fn: FunctionName; sdk: SdkMode; file: string }[] = [];
  for (const sdk of ['external', 'bundled'] as const) {
    const dir = join(OUT, sdk);
    mkdirSync(dir, { recursive: true });
    if (sdk === 'external') linkSdk(dir);
    for (const fn of fns) {
      try {
        const file = await build(fn, sdk, dir);
        const bytes = readFileSync(file);
        sizes.push({ fn, sdk, bytes: bytes.length, gzipBytes: gzipSync(bytes, { level: 9 }).length });
        built.push({ fn, sdk, file });
      } catch (error) {
        failures.push(`${fn} (SDK ${sdk}): build failed: ${(error as Error).message.split('\n')[0]}`);
      }
    }
  }
  // A variant that throws at import (e.g. a wrapper not built yet) is reported, not measured.
  const importable = built.filter(({ fn, sdk, file }) => {
    if (sdk === 'bundled' && WITHOUT_SDK.has(fn)) return false;
    const r = spawnSync(process.execPath, [file], { encoding: 'utf8' });
    if (r.status === 0) return true;
    const why = r.stderr.split('\n').find((l) => /^\w*Error\b/.test(l)) ?? `exit ${r.status}`;
    failures.push(`${fn} (SDK ${sdk}): import failed: ${why.trim()}`);
    return false;
  });
  const empty = join(OUT, 'empty.mjs');
  writeFileSync(empty, '');
  const hyperfine = hyperfineVersion();
  const loadBefore = loadavg()[0] ?? 0;
  const files = [empty, ...importable.map((b) => b.file)];
  log(`lambda: timing ${files.length} processes × ${options.runs} (${hyperfine ?? 'spawn loop'})`);
  const processTimes =
    hyperfine === undefined
      ? timeProcessLoop(files, options.runs)
      : timeProcessHyperfine(files, options.runs, options.warmup ?? 3, join(OUT, 'hyperfine.json'));
  log(`lambda: timing imports × ${options.runs}`);
  const importTimes = timeImports(
    importable.map((b) => b.file),
    options.runs,
    OUT,
  );
  const loadAfter = loadavg()[0] ?? 0;
  return {
    date: new Date().toISOString(),
    loadAverage: [loadBefore, loadAfter],
    esbuild: versionOf('esbuild'),
    versions: Object.fromEntries(
      [
        '@aws-lambda-powertools/idempotency',
        '@aws-sdk/client-dynamodb',
        '@oncely/lambda',
        '@oncely/core',
        '@oncely/dynamodb',
      ].map((name) => [name, versionOf(name)]),
    ),
    runs: options.runs,
    timer: hyperfine ?? 'spawn loop',
    nodeAlone: spread(processTimes[0] ?? []),
    sizes,
    imports: importable.map(({ fn, sdk }, i) => ({
      fn,
      sdk,
      process: spread(processTimes[i + 1] ?? []),
      importOnly: spread(importTimes[i] ?? []),
    })),
    failures,
  };
}

const LABEL: Record<FunctionName, string> = {
  bare: 'the function alone (no idempotency, no SDK)',
  'sdk-only': 'the function with a `DynamoDBClient` (no idempotency)',
  oncely: '`@oncely/lambda` + `DynamoDBStore`',
  'oncely-alone': '`@oncely/lambda` alone (its default `MemoryStore`, no SDK)',
  'powertools-alone': 'Powertools alone (`CachePersistenceLayer` over a stub client, no SDK)',
  powertools: 'Powertools `makeIdempotent` + `DynamoDBPersistenceLayer`',
};

const kb = (bytes: number) => `${(bytes / 1024).toFixed(1)} KiB`;
const ms = (value: number) => value.toFixed(1);

/** The command that reproduces a run of `runs` samples. */
export const lambdaCommand = (runs: number) => `npm run bench:lambda -- --runs ${runs} --report`;

/** Markdown tables of one run (used by docs/benchmarks.md and printed by lambda-cold-start.ts). */
export function renderLambdaColdStart(r: LambdaColdStart): string[] {
  const out: string[] = [];
  const size = (fn: FunctionName, sdk: SdkMode) => r.sizes.find((s) => s.fn === fn && s.sdk === sdk);
  const fns = [...new Set(r.sizes.map((s) => s.fn))];
  out.push(
    `esbuild ${r.esbuild} (\`--bundle --minify --platform=node --target=node20 --format=esm\`), ${Object.entries(
      r.versions,
    )
      .map(([n, v]) => `${n} ${v}`)
      .join(', ')}.`,
  );
  out.push('');
  out.push('| function | bundle, SDK external | gzip | bundle, SDK bundled | gzip |');
  out.push('| --- | --: | --: | --: | --: |');
  for (const fn of fns) {
    const e = size(fn, 'external');
    const b = size(fn, 'bundled');
    out.push(
      `| ${LABEL[fn]} | ${e ? kb(e.bytes) : '–'} | ${e ? kb(e.gzipBytes) : '–'} | ${b ? kb(b.bytes) : '–'} | ${b ? kb(b.gzipBytes) : '–'} |`,
    );
  }
  out.push('');
  out.push(
    `Import time, ${r.runs} fresh processes per variant: **import** is \`await import(bundle)\` timed inside the process (variants taking turns); **process** is \`node bundle.mjs\` start to exit (${r.timer}; \`node\` on an empty module: median ${ms(r.nodeAlone.median)} ms, quartiles ${ms(r.nodeAlone.p25)}–${ms(r.nodeAlone.p75)}). Milliseconds, median (quartiles; min–max).${r.loadAverage === undefined ? '' : ` Load average ${r.loadAverage[0].toFixed(1)} when the timing began and ${r.loadAverage[1].toFixed(1)} when it ended, on ${cpus().length} CPUs.`}`,
  );
  out.push('');
  out.push('| function | SDK | import | process |');
  out.push('| --- | --- | --: | --: |');
  for (const i of r.imports) {
    const cell = (s: Spread) => `**${ms(s.median)}** (${ms(s.p25)}–${ms(s.p75)}; ${ms(s.min)}–${ms(s.max)})`;
    out.push(
      `| ${LABEL[i.fn]} | ${WITHOUT_SDK.has(i.fn) ? 'none' : i.sdk} | ${cell(i.importOnly)} | ${cell(i.process)} |`,
    );
  }
  if (r.failures.length > 0) {
    out.push('');
    for (const f of r.failures) out.push(`- Not measured: ${f}`);
  }
  return out;
}

export const LAMBDA_BEGIN =
  '<!-- lambda-cold-starts: written by benchmarks/lambda-cold-start.ts --report -->';
export const LAMBDA_END = '<!-- /lambda-cold-starts -->';

/** The section of docs/benchmarks.md, between markers that `lambda-cold-start.ts --report` rewrites alone. */
export function lambdaSection(r: LambdaColdStart): string[] {
  return [
    LAMBDA_BEGIN,
    '## AWS Lambda: cold starts',
    '',
    `The same API Gateway (HTTP API) function, \`(event) => ({ statusCode: 201, body })\`, made idempotent with \`@oncely/lambda\` and \`DynamoDBStore\`, and with Powertools' \`makeIdempotent\` and \`DynamoDBPersistenceLayer\` (\`eventKeyJmesPath: 'headers."idempotency-key"'\`); the functions' sources are in \`benchmarks/src/lambda.ts\`. Bundled as a deployment is, with the AWS SDK v3 external (the Node.js runtime provides it) and bundled. Run ${r.date ?? ''} on the machine above. Reproduce: \`${lambdaCommand(r.runs)}\`.`,
    '',
    ...renderLambdaColdStart(r),
    LAMBDA_END,
  ];
}
