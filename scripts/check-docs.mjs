// Keeps the docs working for a user: every TypeScript and JavaScript code block of README.md, docs/ and the package
// READMEs compiles as a user's project would compile it (strict, `module: NodeNext`, against the built packages: run
// `npm run build` first, and the framework versions the workspace installs; one program for all blocks, so it stays
// fast). Before that, without a build: each package.json leads back to the repository (`repository` with its
// `directory`, `homepage`, `bugs`), package READMEs link absolutely (npm shows them without the repository), links
// into the repository resolve to a file and heading, no page of oncely.dev is linked (it has none; problem type URIs
// are identifiers, not pages), and no text cites a section number of an unpublished contract (`§`, except an RFC's).
//
// Each block becomes a module of its own in node_modules/.cache/check-docs/. An HTML comment right before a block
// (blank lines between are allowed) changes how it is checked:
//   <!-- ts-check-preamble: declare const app: Express; -->  hidden lines put before the block (may span lines)
//   <!-- ts-check-files: examples/docs-consumers/app.ts -->  files of the repository put beside the block, for a
//                                                            block that imports `./app.js` (checked too)
//   <!-- no-check: why this block cannot compile on its own -->  the block is not checked (keep these rare)
// Usage: node scripts/check-docs.mjs [--list] [--no-types]
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { builtinModules } from 'node:module';
import { basename, dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const outDir = join(root, 'node_modules', '.cache', 'check-docs');
const checkedLanguages = new Map([
  ['ts', '.ts'],
  ['typescript', '.ts'],
  ['js', '.js'],
  ['javascript', '.js'],
]);

/** The markdown files whose blocks are checked: README.md, docs/**, packages/<name>/README.md. */
function markdownFiles() {
  const files = ['README.md'];
  const walk = (dir) => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true })) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.md')) files.push(path);
    }
  };
  walk('docs');
  for (const name of readdirSync(join(root, 'packages'))) {
    if (existsSync(join(root, 'packages', name, 'README.md'))) files.push(`packages/${name}/README.md`);
  }
  return files.sort();
}

/**
 * The fenced blocks of one markdown file, each with the directive of the HTML comment right before it.
 * `line` is the 1-based line of the opening fence.
 */
function blocksOf(file) {
  const lines = readFileSync(join(root, file), 'utf8').split('\n');
  const blocks = [];
  const problems = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([\w-]*)/.exec(lines[i]);
    if (!open) continue;
    const [, indent, fence, language] = open;
    const body = [];
    let end = i + 1;
    while (end < lines.length && !new RegExp(`^\\s*${fence[0]}{${fence.length},}\\s*$`).test(lines[end])) {
      body.push(lines[end].startsWith(indent) ? lines[end].slice(indent.length) : lines[end].trimStart());
      end++;
    }
    const directive = directiveBefore(lines, i);
    if (directive.problem) problems.push(`${file}:${directive.line}: ${directive.problem}`);
    blocks.push({ file, line: i + 1, language: language.toLowerCase(), code: body.join('\n'), directive });
    i = end;
  }
  return { blocks, problems };
}

/** The `ts-check-preamble` or `no-check` comment that ends right before line `index` (blank lines skipped). */
function directiveBefore(lines, index) {
  let last = index - 1;
  while (last >= 0 && lines[last].trim() === '') last--;
  if (last < 0 || !lines[last].trimEnd().endsWith('-->')) return {};
  let first = last;
  while (first >= 0 && !lines[first].includes('<!--')) first--;
  if (first < 0) return {};
  const text = lines
    .slice(first, last + 1)
    .join('\n')
    .replace(/^[\s\S]*?<!--/, '')
    .replace(/-->\s*$/, '');
  const match = /^\s*([\w-]+):([\s\S]*)$/.exec(text);
  const name = match?.[1];
  if (name === 'ts-check-preamble') return { line: first + 1, preamble: match[2].trim() };
  if (name === 'ts-check-files') {
    const files = match[2].trim().split(/\s+/).filter(Boolean);
    const missing = files.filter((file) => !existsSync(join(root, file)));
    if (missing.length)
      return { line: first + 1, problem: `ts-check-files: no such file ${missing.join(', ')}` };
    return { line: first + 1, files };
  }
  if (name === 'no-check') {
    const reason = match[2].trim();
    return reason
      ? { line: first + 1, skip: reason }
      : { line: first + 1, problem: 'no-check needs a reason' };
  }
  if (name?.startsWith('ts-check') || name?.startsWith('no-check')) {
    return {
      line: first + 1,
      problem: `unknown directive '${name}' (ts-check-preamble, ts-check-files, no-check)`,
    };
  }
  return {};
}

/** `express` for 'express/lib/x', `@oncely/core` for '@oncely/core/sub'; undefined for relative and built-in modules. */
function packageName(specifier) {
  if (specifier.startsWith('.') || specifier.startsWith('/') || specifier.startsWith('node:'))
    return undefined;
  const parts = specifier.split('/');
  const name = specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
  return builtinModules.includes(name) ? undefined : name;
}

/** Where a package a block imports is installed: the workspace package itself, or the first workspace that has it. */
function findPackage(name) {
  const workspaces = ['packages', 'examples']
    .flatMap((dir) => readdirSync(join(root, dir)).map((child) => join(root, dir, child)))
    .concat(join(root, 'benchmarks'));
  for (const dir of workspaces) {
    const manifest = join(dir, 'package.json');
    if (existsSync(manifest) && JSON.parse(readFileSync(manifest, 'utf8')).name === name) return dir;
  }
  for (const dir of workspaces) {
    const installed = join(dir, 'node_modules', name);
    if (existsSync(installed)) return realpathSync(installed);
  }
  return undefined;
}

function link(name, target) {
  const path = join(outDir, 'node_modules', name);
  mkdirSync(dirname(path), { recursive: true });
  if (!existsSync(path)) symlinkSync(target, path, 'dir');
}

const problems = [...metadataAndLinkProblems()];
if (process.argv.includes('--no-types')) finish(0, 'types not checked (--no-types)');
const blocks = [];
for (const file of markdownFiles()) {
  const found = blocksOf(file);
  problems.push(...found.problems);
  blocks.push(...found.blocks);
}
const checked = blocks.filter((block) => checkedLanguages.has(block.language) && !block.directive.skip);
const skipped = blocks.filter((block) => checkedLanguages.has(block.language) && block.directive.skip);
for (const block of blocks) {
  if ((block.directive.preamble || block.directive.files) && !checkedLanguages.has(block.language)) {
    problems.push(
      `${block.file}:${block.directive.line}: a ts-check directive before a '${block.language}' block`,
    );
  }
}

if (process.argv.includes('--list')) {
  for (const block of checked) console.log(`check ${block.file}:${block.line}`);
  for (const block of skipped) console.log(`skip  ${block.file}:${block.line} (${block.directive.skip})`);
}

rmSync(outDir, { recursive: true, force: true });
mkdirSync(outDir, { recursive: true });
// The blocks are ES modules, as in a project with "type": "module".
writeFileSync(join(outDir, 'package.json'), `${JSON.stringify({ type: 'module', private: true })}\n`);

const sources = new Map();
/** Repository files copied beside the blocks (ts-check-files), by their path in the copy. */
const copies = new Map();
const needed = new Set();
for (const block of checked) {
  const preamble = block.directive.preamble ? `${block.directive.preamble}\n` : '';
  const name = `${block.file.replace(/[/.]/g, '_')}_L${block.line}${checkedLanguages.get(block.language)}`;
  const path = join(outDir, name);
  const text = `${preamble}${block.code}\n`;
  writeFileSync(path, text);
  sources.set(path, { block, preambleLines: preamble ? preamble.split('\n').length - 1 : 0 });
  const texts = [text];
  for (const file of block.directive.files ?? []) {
    const copy = join(outDir, basename(file));
    const copied = readFileSync(join(root, file), 'utf8');
    writeFileSync(copy, copied);
    copies.set(copy, file);
    texts.push(copied);
  }
  for (const imported of texts.flatMap((text) => ts.preProcessFile(text, true, true).importedFiles)) {
    const name = packageName(imported.fileName);
    if (name) needed.add(name);
  }
}
for (const name of needed) {
  const types = `@types/${name.startsWith('@') ? name.slice(1).replace('/', '__') : name}`;
  const typesTarget = findPackage(types);
  if (typesTarget) link(types, typesTarget);
  const target = findPackage(name);
  if (!target && typesTarget) continue; // a types-only package, such as aws-lambda's
  if (!target) {
    problems.push(`blocks import '${name}', which no workspace package depends on: add it where it belongs`);
    continue;
  }
  link(name, target);
  if (name.startsWith('@oncely/') && !existsSync(join(target, 'dist'))) {
    problems.push(
      `${name} has no dist/: run \`npm run build\` first (blocks are checked against the built packages)`,
    );
  }
}

const program = ts.createProgram([...sources.keys()], {
  strict: true,
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  moduleDetection: ts.ModuleDetectionKind.Force,
  target: ts.ScriptTarget.ES2022,
  lib: ['lib.es2022.d.ts'],
  types: ['node'],
  typeRoots: [join(root, 'node_modules', '@types')],
  allowJs: true,
  checkJs: true,
  // NestJS's decorators need the legacy decorators every NestJS project compiles with.
  experimentalDecorators: true,
  emitDecoratorMetadata: true,
  skipLibCheck: true,
  noEmit: true,
});

let errors = 0;
for (const diagnostic of ts.getPreEmitDiagnostics(program)) {
  const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ');
  const source = diagnostic.file && sources.get(diagnostic.file.fileName);
  if (diagnostic.category !== ts.DiagnosticCategory.Error) continue;
  errors++;
  if (!source || diagnostic.start === undefined) {
    const file =
      diagnostic.file && (copies.get(diagnostic.file.fileName) ?? relative(root, diagnostic.file.fileName));
    const where = file ? `${file}: ` : '';
    console.error(`${where}error TS${diagnostic.code}: ${message}`);
    continue;
  }
  const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start);
  const text = diagnostic.file.text.split('\n')[line];
  const { block, preambleLines } = source;
  const where =
    line < preambleLines
      ? `${block.file}:${block.directive.line} (ts-check-preamble)`
      : `${block.file}:${block.line + 1 + line - preambleLines}:${character + 1}`;
  console.error(`${where} error TS${diagnostic.code}: ${message}\n    ${text.trim()}`);
}
finish(
  errors,
  `${checked.length} code blocks type-checked, ${skipped.length} skipped with a reason (no-check)`,
);

function finish(typeErrors, summary) {
  for (const problem of problems) console.error(problem);
  if (typeErrors || problems.length) {
    console.error(`\ncheck:docs: ${typeErrors} type errors, ${problems.length} other problems; ${summary}`);
    if (typeErrors)
      console.error("(blocks compile against the packages' dist/: after changing a package, npm run build)");
    process.exit(1);
  }
  console.log(`check:docs: ${summary}`);
  process.exit(0);
}

/** The repository's web address, from the root package.json: the one place it is written besides the packages'. */
function repositoryUrl() {
  const { repository } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  const url = typeof repository === 'string' ? repository : repository?.url;
  if (!url) throw new Error('the root package.json has no repository.url');
  return url.replace(/^git\+/, '').replace(/\.git$/, '');
}

/** GitHub's anchors of a markdown file: each heading's slug (a repeated one gets -1, -2...), and explicit ids. */
function anchorsOf(file) {
  const anchors = new Set();
  const seen = new Map();
  let fence;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const fenceMark = /^\s*(`{3,}|~{3,})/.exec(line)?.[1];
    if (fenceMark && (!fence || fenceMark.startsWith(fence))) fence = fence ? undefined : fenceMark;
    if (fence) continue;
    for (const [, id] of line.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) anchors.add(id);
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1];
    if (heading === undefined) continue;
    const base = heading
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .replace(/<[^>]+>/g, '')
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    anchors.add(count ? `${base}-${count}` : base);
  }
  return anchors;
}

/** The link targets of a markdown file outside code, with their lines. */
function linksOf(file) {
  const links = [];
  let fence;
  readFileSync(join(root, file), 'utf8')
    .split('\n')
    .forEach((line, index) => {
      const fenceMark = /^\s*(`{3,}|~{3,})/.exec(line)?.[1];
      if (fenceMark && (!fence || fenceMark.startsWith(fence))) fence = fence ? undefined : fenceMark;
      if (fence || fenceMark) return;
      const text = line.replace(/`[^`]*`/g, '');
      for (const [, target] of text.matchAll(/\]\(<?([^)\s>]+)>?(?:\s+"[^"]*")?\)/g)) {
        links.push({ line: index + 1, target });
      }
      const definition = /^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)/.exec(text);
      if (definition) links.push({ line: index + 1, target: definition[1] });
    });
  return links;
}

/** Where a link into the repository (`<repo>/blob/main/docs/x.md#y`) fails to lead, or undefined. */
function repositoryLinkProblem(repo, url) {
  const match = new RegExp(
    `^${repo.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}/(?:blob|tree)/main/([^#?]*)(?:#(.*))?$`,
  ).exec(url);
  if (!match) return `${url} is not a link to a file on the main branch`;
  return pathProblem(match[1], match[2]);
}

/** Why the repository path (and anchor) does not exist, or undefined. */
function pathProblem(path, anchor) {
  const full = join(root, decodeURIComponent(path));
  if (!existsSync(full)) return `${path} does not exist`;
  if (anchor && path.endsWith('.md') && !anchorsOf(full).has(decodeURIComponent(anchor))) {
    return `${path} has no heading for #${anchor}`;
  }
  return undefined;
}

/**
 * The source files under `dir`, outside node_modules and dist/. Walked by hand: `readdirSync`'s `recursive` descends
 * into every node_modules first, through pnpm's symlinks on Node 22, which took minutes where this takes a second.
 */
function sourceFiles(dir) {
  if (!existsSync(join(root, dir))) return [];
  const files = [];
  const walk = (path) => {
    for (const entry of readdirSync(join(root, path), { withFileTypes: true })) {
      const child = `${path}/${entry.name}`;
      if (entry.isDirectory()) {
        if (entry.name !== 'node_modules' && entry.name !== 'dist') walk(child);
      } else if (entry.isFile() && /\.(ts|mts|cts|js|mjs|cjs)$/.test(entry.name)) files.push(child);
    }
  };
  walk(dir);
  return files;
}

function metadataAndLinkProblems() {
  const found = [];
  const repo = repositoryUrl();
  const rootManifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  const packageDirs = readdirSync(join(root, 'packages')).filter((name) =>
    existsSync(join(root, 'packages', name, 'package.json')),
  );

  // An installed package leads back to its source, docs and issues.
  for (const name of packageDirs) {
    const file = `packages/${name}/package.json`;
    const manifest = JSON.parse(readFileSync(join(root, file), 'utf8'));
    const expected = {
      'repository.type': ['git', manifest.repository?.type],
      'repository.url': [rootManifest.repository.url, manifest.repository?.url],
      'repository.directory': [`packages/${name}`, manifest.repository?.directory],
      homepage: [`${repo}/tree/main/packages/${name}#readme`, manifest.homepage],
      'bugs.url': [`${repo}/issues`, manifest.bugs?.url],
    };
    for (const [field, [want, have]] of Object.entries(expected)) {
      if (want !== have)
        found.push(`${file}: ${field} is ${JSON.stringify(have)}, expected ${JSON.stringify(want)}`);
    }
  }

  for (const file of markdownFiles()) {
    const onNpm = /^packages\/[^/]+\/README\.md$/.test(file);
    for (const { line, target } of linksOf(file)) {
      const where = `${file}:${line}: ${target}:`;
      if (/^https?:\/\/(www\.)?oncely\.dev\//.test(target) && !/oncely\.dev\/problems\//.test(target)) {
        found.push(`${where} oncely.dev has no such page; link the repository's docs`);
      } else if (target.startsWith(`${repo}/blob/`) || target.startsWith(`${repo}/tree/`)) {
        const problem = repositoryLinkProblem(repo, target);
        if (problem) found.push(`${where} ${problem}`);
      } else if (/^[a-z][a-z0-9+.-]*:/i.test(target)) {
        // another site, mailto:, ...
      } else if (onNpm && !target.startsWith('#')) {
        const path = relative(root, join(root, dirname(file), target.split('#')[0]));
        const anchor = target.includes('#') ? `#${target.split('#')[1]}` : '';
        const kind = existsSync(join(root, path)) && !path.includes('.') ? 'tree' : 'blob';
        found.push(
          `${where} npm shows this README without the repository: link ${repo}/${kind}/main/${path}${anchor}`,
        );
      } else {
        const [path, anchor] = target.split('#');
        const problem = pathProblem(path ? relative(root, join(root, dirname(file), path)) : file, anchor);
        if (problem) found.push(`${where} ${problem}`);
      }
    }
  }

  // Links that messages and comments give, and contract section numbers nobody can look up.
  const texts = [
    ...markdownFiles(),
    ...packageDirs.map((name) => `packages/${name}/package.json`),
    ...packageDirs.flatMap((name) => [
      ...sourceFiles(`packages/${name}/src`),
      ...sourceFiles(`packages/${name}/test`),
    ]),
    ...sourceFiles('examples'),
  ];
  for (const file of texts) {
    readFileSync(join(root, file), 'utf8')
      .split('\n')
      .forEach((text, index) => {
        const where = `${file}:${index + 1}:`;
        for (const match of text.matchAll(/§/g)) {
          if (!/RFC \d+ $/.test(text.slice(0, match.index))) {
            found.push(
              `${where} '§' cites a section nobody can look up; state the rule itself (an RFC's is fine)`,
            );
          }
        }
        if (file.endsWith('.md')) return;
        for (const [url] of text.matchAll(/https?:\/\/[^\s'"`)<>]+/g)) {
          if (/^https?:\/\/(www\.)?oncely\.dev\//.test(url) && !/oncely\.dev\/problems\//.test(url)) {
            found.push(`${where} ${url}: oncely.dev has no such page; link the repository's docs`);
          } else if (url.startsWith(`${repo}/blob/`) || url.startsWith(`${repo}/tree/`)) {
            const problem = repositoryLinkProblem(repo, url);
            if (problem) found.push(`${where} ${url}: ${problem}`);
          }
        }
      });
  }
  return found;
}
