// Jest's own order, less the test files whose services are down (see services.cjs): they are reported in one line
// per service, here before the run and by reporter.cjs after it, instead of failing with connection errors.
const Sequencer = require('@jest/test-sequencer').default;
const { partition, lines } = require('./services.cjs');

class ServicesSequencer extends Sequencer {
  async sort(tests) {
    const { run, missing } = await partition([...new Set(tests.map((test) => test.path))]);
    for (const line of lines(missing)) process.stderr.write(`${line}\n`);
    return super.sort(tests.filter((test) => run.has(test.path)));
  }
}

module.exports = ServicesSequencer;
