// @ts-check
/**
 * TypeDoc configuration for the API reference (`npm run docs:api`).
 *
 * The entry points are read from each published package's exports map (the `@oncely/source` condition names the
 * source file of each subpath), so a new subpath or package appears in the reference without editing this file.
 */
import { readdirSync, readFileSync } from 'node:fs';

const packagesDir = new URL('./packages/', import.meta.url);

/** The name of every published package and the source file of every subpath it exports. */
function publishedPackages() {
  const names = [];
  const entryPoints = [];
  for (const dir of readdirSync(packagesDir).sort()) {
    const manifest = JSON.parse(readFileSync(new URL(`${dir}/package.json`, packagesDir), 'utf8'));
    if (manifest.private) continue;
    names.push(manifest.name);
    for (const target of Object.values(manifest.exports ?? {})) {
      const source = typeof target === 'object' ? target['@oncely/source'] : undefined;
      if (source) entryPoints.push(`packages/${dir}/${source.replace(/^\.\//, '')}`);
    }
  }
  return { names, entryPoints };
}

const published = publishedPackages();

/** @type {Partial<import("typedoc").TypeDocOptions>} */
const config = {
  name: 'oncely',
  entryPoints: published.entryPoints,
  // TypeDoc only requires documentation in the packages named here; every published package must be documented.
  packagesRequiringDocumentation: published.names,
  tsconfig: 'tsconfig.typedoc.json',
  // `npm run typecheck` checks the types; the reference only reads them, in a third less CPU time without the check.
  skipErrorChecking: true,
  out: 'docs/api',
  // Source links point at the public repository, whatever remote (or none) the checkout has: a clone made from a
  // local path has no GitHub remote, and TypeDoc would warn.
  disableGit: true,
  sourceLinkTemplate: 'https://github.com/oncely/oncely/blob/main/{path}#L{line}',
  readme: 'none',
  excludePrivate: true,
  excludeInternal: true,
  treatWarningsAsErrors: true,
  validation: {
    notExported: true,
    invalidLink: true,
    notDocumented: true,
    unusedMergeModuleWith: true,
    invalidPath: true,
    rewrittenLink: true,
  },
  requiredToBeDocumented: [
    'Module',
    'Enum',
    'EnumMember',
    'Variable',
    'Function',
    'Class',
    'Interface',
    'Constructor',
    'Property',
    'Method',
    'Accessor',
    'TypeAlias',
  ],
};

export default config;
