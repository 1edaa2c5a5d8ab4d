// Jest's own order, less the test files whose services are down (see services.cjs): they are reported in one line
// per service, here before the run and by reporter.cjs after it, instead of failing with connection errors.
// Longest first: a file's duration is the one jest cached from its last run, or else its figure in durations.json
// (a fresh clone, as in CI, has no cache, and jest would go by file size). With two workers, a long file started
// last would leave the other worker idle until it ends.
const { existsSync, statSync } = require('node:fs');
const { join, relative } = require('node:path');
const Sequencer = require('@jest/test-sequencer').default;
const { partition, lines } = require('./services.cjs');
const committed = require('./durations.json');

const root = join(__dirname, '..', '..', '..');

class ServicesSequencer extends Sequencer {
  async sort(tests) {
    const { run, missing } = await partition([...new Set(tests.map((test) => test.path))]);
    for (const line of lines(missing)) process.stderr.write(`${line}\n`);
    const kept = tests.filter((test) => run.has(test.path));
    const size = (path) => (existsSync(path) ? statSync(path).size : 0);
    for (const test of kept) {
      const seconds = committed[relative(root, test.path).split('\\').join('/')];
      test.duration = this.time(test) ?? (seconds === undefined ? undefined : seconds * 1000);
    }
    return kept.sort((a, b) => {
      const failed = Number(this.hasFailed(b)) - Number(this.hasFailed(a));
      if (failed !== 0) return failed;
      const known = Number(b.duration !== undefined) - Number(a.duration !== undefined);
      if (known !== 0) return known;
      if (a.duration !== undefined && b.duration !== undefined && a.duration !== b.duration)
        return b.duration - a.duration;
      return size(b.path) - size(a.path);
    });
  }
}

module.exports = ServicesSequencer;
