// Which services a test file needs, whether they answer, and the one line per missing service that the test run
// prints instead of a wall of ECONNREFUSED stack traces. Used by the test sequencer (which leaves out the files
// whose services are missing) and the reporter (which repeats the lines after the summary and fails the run).
//
// A test file names what it needs in the docblock it opens with:
//   /**
//    * @services redis postgres
//    */
// Names: redis, postgres, rabbitmq, nats (servers at the URLs below), redis-server (the binaries, for tests that
// start private Redis servers), postgres-server (initdb, postgres and pg_isready, and as root the postgres user, for
// tests that start private PostgreSQL servers), chromium (the browser, for tests that drive it headless),
// sqs-server (what startSqsServer() needs: fauxqs and a Node 22.5+ to run it, or the server SQS_ENDPOINT names),
// mariadb (MariaDB or MySQL at MYSQL_URL, root without password and database `test` by default), mariadb-server
// (mariadbd or mysqld and mariadb-install-db or mysql_install_db, for tests that start private MariaDB servers).
// A file without the tag needs nothing.
const { existsSync, readdirSync, readFileSync } = require('node:fs');
const { connect } = require('node:net');
const { delimiter, join } = require('node:path');
const { sqsServerProblem } = require('./sqs-server-node.cjs');

const START = 'start it: bash scripts/services.sh (Debian/Ubuntu), or docker compose up -d';

/** @typedef {{ name: string, where: string, check: () => Promise<string | undefined>, start: string }} Service */

/** The address in a URL-ish env value (`redis://u:p@host:port/0`, `host:port`, a comma-separated list). */
function address(value, defaultPort) {
  const first = value.split(',')[0].trim();
  const url = new URL(first.includes('://') ? first : `tcp://${first}`);
  return { host: url.hostname.replace(/^\[|\]$/g, '') || '127.0.0.1', port: Number(url.port || defaultPort) };
}

/**
 * Connects, sends `hello` (if any), and hands the first bytes to `answer`, which returns undefined when they are
 * the service's, or what is wrong. Resolves with undefined (up) or the reason it is not.
 */
function probe({ host, port }, hello, answer, timeoutMs = 2000) {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    const done = (reason) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(reason);
    };
    const timer = setTimeout(() => done(`no answer within ${timeoutMs} ms`), timeoutMs);
    socket.once('connect', () => {
      if (hello) socket.write(hello);
    });
    socket.once('data', (data) => done(answer(data)));
    socket.once('error', (error) => done(error.code ?? error.message));
    socket.once('close', () => done('closed the connection without answering'));
  });
}

function onPath(binary) {
  return (process.env.PATH ?? '').split(delimiter).some((dir) => dir !== '' && existsSync(join(dir, binary)));
}

/** A PostgreSQL binary on PATH or in Debian's /usr/lib/postgresql/<version>/bin (as servers.ts looks for it). */
function postgresBinary(binary) {
  if (onPath(binary)) return true;
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return false;
  return readdirSync(root).some((version) => existsSync(join(root, version, 'bin', binary)));
}

/** As root, initdb and postgres must run as the `postgres` user: it must exist. */
function postgresUser() {
  if (process.getuid?.() !== 0) return true;
  try {
    return /^postgres:/m.test(readFileSync('/etc/passwd', 'utf8'));
  } catch {
    return false;
  }
}

/** A MariaDB binary on PATH or in /usr/sbin (where Debian puts the server, often not on a user's PATH). */
function mariadbBinary(...names) {
  return names.some((binary) => onPath(binary) || existsSync(join('/usr/sbin', binary)));
}

/** Debian's Chromium, where its package puts it. */
const CHROMIUM = '/usr/bin/chromium';

/**
 * The SQS test server: the one SQS_ENDPOINT names, if set (it must answer HTTP); else fauxqs, which each test file
 * starts for itself, and the Node 22.5+ it runs on.
 * @returns {Service}
 */
function sqsServer(env) {
  const named = env.SQS_ENDPOINT;
  if (named !== undefined && named !== '') {
    const target = address(named, named.startsWith('https:') ? 443 : 80);
    return {
      name: 'sqs-server',
      where: `${target.host}:${target.port} (SQS_ENDPOINT)`,
      check: () =>
        probe(target, `GET / HTTP/1.0\r\nHost: ${target.host}\r\n\r\n`, (data) =>
          data.toString('latin1').startsWith('HTTP/') ? undefined : 'answered, but not HTTP',
        ),
      start: 'start it: docker compose up -d sqs, or npm run sqs-server; or unset SQS_ENDPOINT',
    };
  }
  return {
    name: 'sqs-server',
    where: 'fauxqs on a Node 22.5+ (SQS_ENDPOINT unset)',
    check: async () => sqsServerProblem(env),
    start: 'then check with: bash scripts/services.sh --check',
  };
}

/** @returns {Record<string, Service>} */
function services(env = process.env) {
  const redis = address(env.REDIS_URL ?? 'redis://127.0.0.1:6379', 6379);
  const postgres = address(env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test', 5432);
  const rabbitmq = address(env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672', 5672);
  const nats = address(env.NATS_URL ?? '127.0.0.1:4222', 4222);
  const mariadb = address(env.MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test', 3306);
  const at = ({ host, port }, variable) => `${host}:${port} (${variable})`;
  return {
    redis: {
      name: 'redis',
      where: at(redis, 'REDIS_URL'),
      check: () =>
        probe(redis, 'PING\r\n', (data) => {
          const line = data.toString('latin1').split('\r\n')[0];
          return line === '+PONG' ? undefined : `answered ${JSON.stringify(line)} to PING`;
        }),
      start: `${START} redis`,
    },
    postgres: {
      name: 'postgres',
      where: at(postgres, 'DATABASE_URL'),
      // An SSLRequest: every PostgreSQL server answers it with one byte, S or N, before any authentication.
      check: () =>
        probe(postgres, Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]), (data) =>
          data[0] === 0x53 || data[0] === 0x4e ? undefined : 'answered, but not as PostgreSQL',
        ),
      start: `${START} postgres`,
    },
    rabbitmq: {
      name: 'rabbitmq',
      where: at(rabbitmq, 'AMQP_URL'),
      // The AMQP 0-9-1 protocol header: the broker answers with a method frame (type 1), Connection.Start.
      check: () =>
        probe(rabbitmq, Buffer.from('AMQP\x00\x00\x09\x01', 'latin1'), (data) =>
          data[0] === 1 ? undefined : 'answered, but not as an AMQP 0-9-1 broker',
        ),
      start: `${START} rabbitmq`,
    },
    nats: {
      name: 'nats',
      where: at(nats, 'NATS_URL'),
      // A NATS server speaks first: INFO {json}, which says whether JetStream is on.
      check: () =>
        probe(nats, undefined, (data) => {
          const text = data.toString('utf8');
          if (!text.startsWith('INFO ')) return 'answered, but not as NATS';
          const info = JSON.parse(text.slice(5, text.indexOf('\r\n') > 0 ? text.indexOf('\r\n') : undefined));
          return info.jetstream === true
            ? undefined
            : 'answers, but JetStream is off (nats-server needs -js)';
        }),
      start: `${START} nats`,
    },
    mariadb: {
      name: 'mariadb',
      where: at(mariadb, 'MYSQL_URL'),
      // A MySQL server speaks first: a packet (3-byte length, sequence 0) holding the handshake, protocol 10, or
      // an error packet (0xff) when it refuses this host.
      check: () =>
        probe(mariadb, undefined, (data) => {
          if (data.length < 5 || data[3] !== 0) return 'answered, but not as MySQL or MariaDB';
          if (data[4] === 0x0a) return undefined;
          if (data[4] === 0xff)
            return `refused: ${data.subarray(data[7] === 0x23 ? 13 : 7).toString('utf8')}`;
          return 'answered, but not as MySQL or MariaDB';
        }),
      start: `${START} mariadb`,
    },
    'redis-server': {
      name: 'redis-server',
      where: 'PATH',
      check: async () =>
        onPath('redis-server') && onPath('redis-cli')
          ? undefined
          : 'redis-server or redis-cli is not on PATH',
      start: 'install it: bash scripts/services.sh (Debian/Ubuntu: packages redis-server and redis-tools)',
    },
    'postgres-server': {
      name: 'postgres-server',
      where: 'PATH or /usr/lib/postgresql/*/bin',
      check: async () => {
        const missing = ['initdb', 'postgres', 'pg_isready'].filter((binary) => !postgresBinary(binary));
        if (missing.length > 0) return `${missing.join(', ')} not found`;
        return postgresUser() ? undefined : 'running as root, and there is no postgres user to run them as';
      },
      start:
        'install it: bash scripts/services.sh (Debian/Ubuntu: packages postgresql and postgresql-client)',
    },
    'mariadb-server': {
      name: 'mariadb-server',
      where: 'PATH or /usr/sbin',
      check: async () => {
        const missing = [
          ['mariadbd', 'mysqld'],
          ['mariadb-install-db', 'mysql_install_db'],
        ]
          .filter((names) => !mariadbBinary(...names))
          .map((names) => names.join(' or '));
        return missing.length === 0 ? undefined : `${missing.join(', ')} not found`;
      },
      start: 'install it: bash scripts/services.sh (Debian/Ubuntu: package mariadb-server)',
    },
    'sqs-server': sqsServer(env),
    chromium: {
      name: 'chromium',
      where: `${CHROMIUM} or PATH`,
      check: async () =>
        existsSync(CHROMIUM) || onPath('chromium') ? undefined : `neither ${CHROMIUM} nor a chromium on PATH`,
      start: 'install it: bash scripts/services.sh (Debian/Ubuntu: package chromium)',
    },
  };
}

const TAG = /^\s*\/\*\*([\s\S]*?)\*\//;

/** The services a test file's opening docblock names (`@services a b`); throws on a name it does not know. */
function servicesOf(path, known) {
  const head = readFileSync(path, 'utf8').slice(0, 2000);
  const docblock = TAG.exec(head)?.[1] ?? '';
  const names = [];
  for (const match of docblock.matchAll(/@services\s+([^\n]*)/g)) {
    names.push(
      ...match[1]
        .replace(/\*\/?/g, ' ')
        .split(/[\s,]+/)
        .filter(Boolean),
    );
  }
  for (const name of names) {
    if (!(name in known)) {
      throw new Error(`${path}: @services names "${name}"; known: ${Object.keys(known).join(', ')}`);
    }
  }
  return names;
}

// What the sequencer found, for the reporter: both run in jest's main process and share this module.
const state = { missing: [] };

/**
 * Splits `paths` into those to run and, per missing service, those left out. Probes only the services the paths
 * need, once each.
 * @returns {Promise<{ run: Set<string>, missing: { service: Service, reason: string, files: string[] }[] }>}
 */
async function partition(paths) {
  const known = services();
  const needs = new Map(paths.map((path) => [path, servicesOf(path, known)]));
  const wanted = new Set([...needs.values()].flat());
  const reasons = new Map(
    await Promise.all([...wanted].map(async (name) => [name, await known[name].check()])),
  );
  const missing = [...wanted]
    .filter((name) => reasons.get(name) !== undefined)
    .map((name) => ({
      service: known[name],
      reason: reasons.get(name),
      files: paths.filter((path) => needs.get(path).includes(name)),
    }));
  const run = new Set(
    paths.filter((path) => needs.get(path).every((name) => reasons.get(name) === undefined)),
  );
  state.missing = missing;
  return { run, missing };
}

function lines(missing) {
  return missing.map(
    ({ service, reason, files }) =>
      `${service.name}: not reachable at ${service.where}: ${reason}. ${files.length} test file${files.length === 1 ? '' : 's'} left out; ${service.start}`,
  );
}

module.exports = { services, servicesOf, partition, lines, state };
