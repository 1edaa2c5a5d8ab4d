import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { lines, services, servicesOf } from '../jest/services.cjs';
import { freePort, repositoryRoot } from '../src';

const root = repositoryRoot();

function testFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.name === 'node_modules' || entry.name === 'dist') return [];
    if (entry.isDirectory()) return testFiles(path);
    return /\/test\/.*\.test\.ts$/.test(path) ? [path] : [];
  });
}

// What a test file's text shows it connects to. Coarse on purpose: it exists to catch a new test file that talks
// to a service but forgot its @services tag (its run would fail with connection errors instead of one line).
const signs: Record<string, RegExp> = {
  redis: /REDIS_URL|127\.0\.0\.1:6379/,
  'redis-server': /startRedis(Cluster)?\(/,
  postgres: /DATABASE_URL|\bconnectionString\b|testSchema\(|example:express-postgres/,
  rabbitmq: /AMQP_URL|from 'amqplib'|example:amqp/,
  nats: /NATS_URL|@nats-io\//,
  chromium: /from 'playwright-core'|chromium\.launch\(/,
  'sqs-server': /startSqsServer\(/,
  mariadb: /MYSQL_URL|127\.0\.0\.1:3306/,
  'mariadb-server': /startMariadbServer\(/,
};

describe('@services tags', () => {
  // This file is left out: it names every sign as text.
  const files = [...testFiles(join(root, 'packages')), ...testFiles(join(root, 'examples'))].filter(
    (file) => file !== __filename,
  );

  test('every test file that talks to a service names it', () => {
    expect(files.length).toBeGreaterThan(30);
    const known = services();
    const untagged = files.flatMap((file) => {
      const text = readFileSync(file, 'utf8');
      const declared = servicesOf(file, known);
      return Object.entries(signs)
        .filter(([name, sign]) => sign.test(text) && !declared.includes(name))
        .map(([name]) => `${relative(root, file)} needs ${name}`);
    });
    expect(untagged).toEqual([]);
  });

  test('a tag is read from the opening docblock only, and an unknown name is refused', () => {
    const dir = mkdtempSync(join(tmpdir(), 'oncely-services-'));
    try {
      const known = services();
      const tagged = join(dir, 'a.test.ts');
      writeFileSync(tagged, '/**\n * Something.\n * @services redis, postgres\n */\nimport x from "y";\n');
      expect(servicesOf(tagged, known)).toEqual(['redis', 'postgres']);
      const late = join(dir, 'b.test.ts');
      writeFileSync(late, 'import x from "y";\n/**\n * @services redis\n */\n');
      expect(servicesOf(late, known)).toEqual([]);
      const typo = join(dir, 'c.test.ts');
      writeFileSync(typo, '/** @services reddis */\n');
      expect(() => servicesOf(typo, known)).toThrow(/@services names "reddis"; known: redis, postgres/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('service probes', () => {
  let other: Server;
  let otherPort: number;
  const sockets = new Set<Socket>();

  beforeAll(async () => {
    // Something listening that is none of the services: answers every connection with a line of HTTP.
    other = createServer((socket) => {
      sockets.add(socket);
      socket.end('HTTP/1.1 400 Bad Request\r\n\r\n');
    });
    await new Promise<void>((resolve) => other.listen(0, '127.0.0.1', resolve));
    otherPort = (other.address() as { port: number }).port;
  });
  afterAll(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise((resolve) => other.close(resolve));
  });

  test('a closed port is reported with where it looked and how to start the service', async () => {
    const port = await freePort();
    const known = services({ REDIS_URL: `redis://127.0.0.1:${port}` });
    const reason = await known.redis?.check();
    expect(reason).toBe('ECONNREFUSED');
    expect(lines([{ service: known.redis as never, reason: reason as string, files: ['a', 'b'] }])).toEqual([
      `redis: not reachable at 127.0.0.1:${port} (REDIS_URL): ECONNREFUSED. 2 test files left out; start it: bash scripts/services.sh (Debian/Ubuntu), or docker compose up -d redis`,
    ]);
  });

  test('a port where something else answers is not taken for the service', async () => {
    const known = services({
      REDIS_URL: `redis://127.0.0.1:${otherPort}`,
      DATABASE_URL: `postgres://x@127.0.0.1:${otherPort}/test`,
      AMQP_URL: `amqp://127.0.0.1:${otherPort}`,
      NATS_URL: `nats://127.0.0.1:${otherPort}`,
      MYSQL_URL: `mysql://root@127.0.0.1:${otherPort}/test`,
    });
    expect(await known.redis?.check()).toMatch(/^answered "HTTP\/1.1 400 Bad Request" to PING$/);
    expect(await known.postgres?.check()).toBe('answered, but not as PostgreSQL');
    expect(await known.rabbitmq?.check()).toBe('answered, but not as an AMQP 0-9-1 broker');
    expect(await known.nats?.check()).toBe('answered, but not as NATS');
    expect(await known.mariadb?.check()).toBe('answered, but not as MySQL or MariaDB');
  });

  test('a MariaDB that refuses this host is reported with its message', async () => {
    const refusals = new Set<Socket>();
    // What mariadbd sends a host it does not allow: an error packet (0xff, code 1130, no SQL state).
    const message = "Host '10.0.0.9' is not allowed to connect to this MariaDB server";
    const body = Buffer.concat([Buffer.from([0xff, 0x6a, 0x04]), Buffer.from(message)]);
    const header = Buffer.from([body.length & 0xff, (body.length >> 8) & 0xff, 0, 0]);
    const refusing = createServer((socket) => {
      refusals.add(socket);
      socket.end(Buffer.concat([header, body]));
    });
    await new Promise<void>((resolve) => refusing.listen(0, '127.0.0.1', resolve));
    try {
      const port = (refusing.address() as { port: number }).port;
      expect(await services({ MYSQL_URL: `127.0.0.1:${port}` }).mariadb?.check()).toBe(`refused: ${message}`);
    } finally {
      for (const socket of refusals) socket.destroy();
      await new Promise((resolve) => refusing.close(resolve));
    }
  });

  test('NATS without JetStream is reported as such', async () => {
    const natsSockets = new Set<Socket>();
    const nats = createServer((socket) => {
      natsSockets.add(socket);
      socket.write('INFO {"server_id":"x","jetstream":false}\r\n');
    });
    await new Promise<void>((resolve) => nats.listen(0, '127.0.0.1', resolve));
    try {
      const port = (nats.address() as { port: number }).port;
      expect(await services({ NATS_URL: `127.0.0.1:${port}` }).nats?.check()).toBe(
        'answers, but JetStream is off (nats-server needs -js)',
      );
    } finally {
      for (const socket of natsSockets) socket.destroy();
      await new Promise((resolve) => nats.close(resolve));
    }
  });
});

// The whole run, as a user with Redis down would see it: one jest process on a file that needs Redis and one that
// needs nothing, with REDIS_URL pointing at a closed port.
describe('a test run with a service down', () => {
  test('leaves its files out, says so in one line, runs the rest, and fails', async () => {
    const port = await freePort();
    const result = spawnSync(
      process.execPath,
      [
        join(root, 'node_modules/jest/bin/jest.js'),
        '--ci',
        'packages/redis/test/redis-store.test.ts',
        'packages/core/test/parsing.test.ts',
      ],
      {
        cwd: root,
        env: { ...process.env, REDIS_URL: `redis://127.0.0.1:${port}` },
        encoding: 'utf8',
        timeout: 120_000,
      },
    );
    const output = `${result.stdout}${result.stderr}`;
    expect(result.status).toBe(1);
    const redisLines = output.split('\n').filter((line) => line.startsWith('redis: not reachable'));
    // Once before the run, once after the summary.
    expect(redisLines).toEqual([
      expect.stringContaining(`127.0.0.1:${port} (REDIS_URL): ECONNREFUSED. 1 test file left out`),
      expect.stringContaining(`127.0.0.1:${port} (REDIS_URL): ECONNREFUSED. 1 test file left out`),
    ]);
    expect(output).toMatch(/PASS packages\/core\/test\/parsing\.test\.ts/);
    expect(output).not.toMatch(/(PASS|FAIL) packages\/redis\/test\/redis-store\.test\.ts/);
    expect(output).toMatch(/Test Suites: 1 passed, 1 total/);
    expect(output).not.toMatch(/ECONNREFUSED 127\.0\.0\.1/);
  }, 150_000);
});

// compose.yaml cannot be run here (no Docker): at least it must not drift from CI's images and the tests' ports.
describe('compose.yaml', () => {
  test("uses CI's images and publishes each service on the port the tests look at", () => {
    const compose = readFileSync(join(root, 'compose.yaml'), 'utf8');
    const workflow = readFileSync(join(root, '.github/workflows/ci.yml'), 'utf8');
    const images = (text: string) => [...text.matchAll(/image: (\S+)/g)].map((match) => match[1]);
    // Each image once: the Node 20/24 job uses the same Redis image as the full one.
    const ciImages = [
      ...new Set([
        ...images(workflow),
        ...[...workflow.matchAll(/docker run .* (nats:\S+)/g)].map((m) => m[1]),
      ]),
    ];
    // Plus fauxqs, which CI does not run as a container: each SQS test file starts it from npm.
    expect(images(compose).sort()).toEqual([...ciImages, 'kibertoad/fauxqs:2.4.1'].sort());
    const fauxqs = JSON.parse(readFileSync(join(root, 'packages/testing/package.json'), 'utf8'))
      .devDependencies.fauxqs as string;
    expect(compose).toContain(`image: kibertoad/fauxqs:${fauxqs}`);

    const known = services({});
    for (const name of ['redis', 'postgres', 'mariadb', 'rabbitmq', 'nats']) {
      const port = /:(\d+) \(/.exec(known[name]?.where ?? '')?.[1];
      const published = new RegExp(
        `\\n  ${name}:\\n(?:    .*\\n|\\n)*?    ports: \\["127\\.0\\.0\\.1:${port}:${port}"\\]`,
      );
      expect({ name, published: published.test(compose) }).toEqual({ name, published: true });
    }
    // SQS_ENDPOINT's port in the messages that tell people to run it.
    expect(compose).toMatch(/\n {2}sqs:\n(?: {4}.*\n)*? {4}ports: \["127\.0\.0\.1:4566:4566"\]/);
  });
});
