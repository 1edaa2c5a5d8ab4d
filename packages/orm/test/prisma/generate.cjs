// Generates the tests' Prisma clients (postgres.prisma, mariadb.prisma) into generated/, which is not committed:
// run by the package's typecheck and as jest's globalSetup, once per run in jest's own process before any worker
// starts (a fresh clone may run `npm test` first; the test files import the clients statically, and two workers
// generating at once would write the same files). Skips a client already generated from the same schema by the
// same Prisma version.
const { execFileSync } = require('node:child_process');
const { existsSync, readFileSync, writeFileSync } = require('node:fs');
const { join } = require('node:path');

const here = __dirname;
const cli = require.resolve('prisma/build/index.js', { paths: [here] });
const version = require(require.resolve('prisma/package.json', { paths: [here] })).version;

function generate(name) {
  const schema = join(here, `${name}.prisma`);
  const stamp = join(here, 'generated', name, '.oncely-stamp');
  const wanted = `${version}\n${readFileSync(schema, 'utf8')}`;
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === wanted) return;
  execFileSync(process.execPath, [cli, 'generate', '--schema', schema], {
    cwd: here,
    stdio: 'pipe',
    env: {
      ...process.env,
      // `prisma generate` first downloads the schema engine (which only migrate and db commands run) unless this
      // names an existing file; generating needs no engine, and the download host may be unreachable.
      PRISMA_SCHEMA_ENGINE_BINARY: process.execPath,
      CHECKPOINT_DISABLE: '1',
      PRISMA_HIDE_UPDATE_MESSAGE: '1',
    },
  });
  writeFileSync(stamp, wanted);
}

function generatePrismaClients() {
  generate('postgres');
  generate('mariadb');
}

module.exports = generatePrismaClients;
if (require.main === module) generatePrismaClients();
