// The rehearsal's upload action (see action.yml): @actions/glob finds the files, @actions/artifact uploads them.
'use strict';
const fs = require('fs');
const path = require('path');

function input(name, fallback = '') {
  const value = process.env[`INPUT_${name.replace(/ /g, '_').toUpperCase()}`];
  return value === undefined || value.trim() === '' ? fallback : value.trim();
}

function setOutput(name, value) {
  fs.appendFileSync(process.env.GITHUB_OUTPUT, `${name}=${value}\n`);
}

// the folder the artifact is rooted at: one search path (a folder, or a file's folder), else their common ancestor
function rootOf(searchPaths) {
  let root = searchPaths[0];
  for (const p of searchPaths.slice(1)) {
    while (!(p + path.sep).startsWith(root + path.sep)) root = path.dirname(root);
  }
  return fs.existsSync(root) && fs.statSync(root).isFile() ? path.dirname(root) : root;
}

async function main() {
  const { DefaultArtifactClient } = require('@actions/artifact');
  const glob = require('@actions/glob');
  const name = input('name', 'artifact');
  const ifNone = input('if-no-files-found', 'warn');
  const retentionDays = parseInt(input('retention-days', '0'), 10) || undefined;
  process.chdir(process.env.GITHUB_WORKSPACE || '.');
  const globber = await glob.create(input('path'), {
    implicitDescendants: true, excludeHiddenFiles: input('include-hidden-files', 'false') !== 'true' });
  const files = (await globber.glob()).filter((f) => fs.statSync(f).isFile());
  if (files.length === 0) {
    const msg = `No files were found with the provided path: ${input('path')}. No artifacts will be uploaded.`;
    if (ifNone === 'error') throw new Error(msg);
    console.log(ifNone === 'ignore' ? msg : `::warning::${msg}`);
    return;
  }
  const root = rootOf(globber.getSearchPaths());
  const { id, size } = await new DefaultArtifactClient().uploadArtifact(name, files, root, { retentionDays });
  const url = `${process.env.GITHUB_SERVER_URL}/${process.env.GITHUB_REPOSITORY}/actions/runs/` +
    `${process.env.GITHUB_RUN_ID}/artifacts/${id}`;
  console.log(`upload (@actions/artifact): artifact ${name}, ${files.length} file(s), ${size} bytes, id ${id}: ${url}`);
  setOutput('artifact-id', id);
  setOutput('artifact-url', url);
}

main().catch((e) => {
  console.log(`::error::upload ${input('name', 'artifact')}: ${e.message}`);
  process.exitCode = 1;
});
