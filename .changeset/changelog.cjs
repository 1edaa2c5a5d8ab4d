// Writes CHANGELOG entries for users: each changeset's text as one bullet, without the commit hash that
// changesets' default generator puts first, and a package released only because an internal dependency was gets
// one line naming the versions it now needs (whose changes are in their own CHANGELOGs).
'use strict';

async function getReleaseLine(changeset) {
  const [first, ...rest] = changeset.summary.trim().split('\n');
  return [`- ${first}`, ...rest.map((line) => (line.trim() === '' ? '' : `  ${line.trimEnd()}`))].join('\n');
}

async function getDependencyReleaseLine(_changesets, dependencies) {
  if (dependencies.length === 0) return '';
  const names = dependencies.map(({ name, newVersion }) => `\`${name}\` ${newVersion}`);
  return `- Works with ${names.join(', ')}.`;
}

module.exports = { default: { getReleaseLine, getDependencyReleaseLine } };
