// Where the SQS test server (fauxqs, started by startSqsServer() in src/sqs-server.ts) gets its Node: fauxqs needs
// 22.5 or later (node:sqlite), the tests may run on an older one. Shared by that harness and by the `sqs-server`
// entry of services.cjs, so that a machine without one gets one line saying what to do instead of failing tests.
const { execFileSync } = require('node:child_process');
const { existsSync } = require('node:fs');
const { dirname, join } = require('node:path');

const MINIMUM = [22, 5];
const PACKAGED_VERSION = '22.23.3';
const CHILD = join(__dirname, '..', 'src', 'sqs-server-child.mjs');
const HOW =
  `run the tests on Node ${MINIMUM.join('.')} or later; or set SQS_SERVER_NODE to such a node binary; or start an SQS ` +
  'server (docker compose up -d sqs, or npm run sqs-server) and set SQS_ENDPOINT=http://127.0.0.1:4566';

function atLeastMinimum(version) {
  const [major = 0, minor = 0] = version.replace(/^v/, '').split('.').map(Number);
  return major > MINIMUM[0] || (major === MINIMUM[0] && minor >= MINIMUM[1]);
}

/** The npm package with a Node binary for this platform; npm has them for linux-x64, linux-arm64, darwin-x64. */
function packagedName() {
  return `node-${process.platform}-${process.arch}`;
}

/**
 * The Node to run fauxqs on: SQS_SERVER_NODE if set; else the running Node when it is 22.5 or later; else the one
 * the optional dependency node-<platform>-<arch> of @oncely/testing installed. Throws saying what to do if none.
 * @returns {{ path: string, version: string, from: string }}
 */
function sqsServerNode(env = process.env) {
  const chosen = env.SQS_SERVER_NODE;
  if (chosen !== undefined && chosen !== '') {
    let version;
    try {
      version = execFileSync(chosen, ['--version'], { encoding: 'utf8' }).trim();
    } catch (error) {
      throw new Error(`SQS_SERVER_NODE=${chosen} does not run (${error.message}); ${HOW}`);
    }
    if (!atLeastMinimum(version)) {
      throw new Error(
        `SQS_SERVER_NODE=${chosen} is Node ${version}; fauxqs needs ${MINIMUM.join('.')} or later: ${HOW}`,
      );
    }
    return { path: chosen, version, from: 'SQS_SERVER_NODE' };
  }
  if (atLeastMinimum(process.version)) {
    return { path: process.execPath, version: process.version, from: 'the running Node' };
  }
  const name = packagedName();
  try {
    const manifest = require.resolve(`${name}/package.json`);
    const path = join(dirname(manifest), 'bin', 'node');
    if (existsSync(path))
      return { path, version: `v${require(manifest).version}`, from: `the npm package ${name}` };
  } catch {
    // not installed: npm has no such package for this platform, or optional dependencies were left out
  }
  throw new Error(
    `no Node ${MINIMUM.join('.')} or later to run fauxqs (the SQS test server): the tests run on Node ` +
      `${process.version}, and the optional dependency ${name}@${PACKAGED_VERSION} of @oncely/testing is not ` +
      'installed (npm publishes it for linux-x64, linux-arm64 and darwin-x64 only; on those, run `npm run setup` ' +
      `again). Do one of: ${HOW}`,
  );
}

/** Whether fauxqs is installed where the child script imports it from. Its exports allow `import` only. */
function fauxqsInstalled() {
  return (require.resolve.paths('fauxqs') ?? []).some((dir) =>
    existsSync(join(dir, 'fauxqs', 'package.json')),
  );
}

/** Undefined when startSqsServer() can start fauxqs here, else what is missing and what to do. */
function sqsServerProblem(env = process.env) {
  if (!fauxqsInstalled()) return 'fauxqs is not installed: run npm run setup';
  try {
    sqsServerNode(env);
    return undefined;
  } catch (error) {
    return error.message;
  }
}

module.exports = { sqsServerNode, sqsServerProblem, CHILD, MINIMUM };
