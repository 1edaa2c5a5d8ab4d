// AWS Lambda cold starts of @oncely/lambda and of Powertools idempotency on the same function: bundle sizes
// (esbuild) and import times (fresh processes). `node --import tsx lambda-cold-start.ts [--runs n] [--smoke]
// [--report]` in benchmarks/, after `npm run build`; prints the tables and writes benchmarks/results/lambda.json;
// --report also rewrites its section of docs/benchmarks.md. `pnpm bench` runs it too (its --smoke with 2 runs).
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BENCH_DIR } from './src/child';
import {
  LAMBDA_BEGIN,
  LAMBDA_END,
  lambdaSection,
  measureLambdaColdStart,
  renderLambdaColdStart,
} from './src/lambda';

const { values } = parseArgs({
  options: { runs: { type: 'string' }, smoke: { type: 'boolean' }, report: { type: 'boolean' } },
  strict: true,
});
const runs = values.smoke ? 2 : Number(values.runs ?? 40);
if (!Number.isSafeInteger(runs) || runs < 1) throw new Error('--runs must be a positive integer');

const result = await measureLambdaColdStart({
  runs,
  warmup: values.smoke ? 0 : 3,
  log: (line) => process.stderr.write(`${line}\n`),
});
mkdirSync(join(BENCH_DIR, 'results'), { recursive: true });
writeFileSync(join(BENCH_DIR, 'results', 'lambda.json'), `${JSON.stringify(result, null, 2)}\n`);
console.log(renderLambdaColdStart(result).join('\n'));
if (result.imports.length === 0) {
  console.error('no variant could be imported');
  process.exit(1);
}

if (values.report && !values.smoke) {
  // Only this section of the page: the rest is the last full run's (`pnpm bench --report`).
  const page = join(BENCH_DIR, '..', 'docs', 'benchmarks.md');
  const text = readFileSync(page, 'utf8');
  const section = lambdaSection(result).join('\n');
  const begin = text.indexOf(LAMBDA_BEGIN);
  const end = text.indexOf(LAMBDA_END);
  const where = text.indexOf('\n## Where the time goes');
  const next =
    begin >= 0 && end > begin
      ? text.slice(0, begin) + section + text.slice(end + LAMBDA_END.length)
      : where >= 0
        ? `${text.slice(0, where + 1)}${section}\n\n${text.slice(where + 1)}`
        : `${text.trimEnd()}\n\n${section}\n`;
  writeFileSync(page, next);
  console.error('wrote its section of docs/benchmarks.md');
}
