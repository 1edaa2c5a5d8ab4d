// After jest's summary: one line per service that was down, and a failed run, since not every test ran.
const { lines, state } = require('./services.cjs');

class ServicesReporter {
  onRunComplete() {
    if (state.missing.length === 0) return;
    process.stderr.write(`\nNot every test ran: ${state.missing.length} service(s) not reachable.\n`);
    for (const line of lines(state.missing)) process.stderr.write(`${line}\n`);
  }

  getLastError() {
    if (state.missing.length === 0) return undefined;
    return new Error(
      `services not reachable: ${state.missing.map(({ service }) => service.name).join(', ')}`,
    );
  }
}

module.exports = ServicesReporter;
