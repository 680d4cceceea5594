// The rehearsal's download action (see action.yml): @actions/artifact lists and downloads, minimatch matches names.
'use strict';
const fs = require('fs');
const path = require('path');

function input(name, fallback = '') {
  const value = process.env[`INPUT_${name.replace(/ /g, '_').toUpperCase()}`];
  return value === undefined || value.trim() === '' ? fallback : value.trim();
}

async function main() {
  const { DefaultArtifactClient } = require('@actions/artifact');
  const { minimatch } = require('minimatch');
  const client = new DefaultArtifactClient();
  const dest = path.resolve(process.env.GITHUB_WORKSPACE || '.', input('path', '.'));
  const name = input('name');
  if (name) {
    const { artifact } = await client.getArtifact(name);
    await client.downloadArtifact(artifact.id, { path: dest });
    console.log(`download (@actions/artifact): ${name} into ${dest}`);
  } else {
    const pattern = input('pattern');
    const { artifacts } = await client.listArtifacts({ latest: true });
    const matched = artifacts.filter((a) => !pattern || minimatch(a.name, pattern));
    const merge = input('merge-multiple', 'false') === 'true';
    for (const a of matched) {
      const into = merge ? dest : path.join(dest, a.name);
      await client.downloadArtifact(a.id, { path: into });
      console.log(`download (@actions/artifact): ${a.name} into ${into}`);
    }
    if (matched.length === 0) console.log(`no artifact of this run matches '${pattern || '*'}'`);
  }
  fs.appendFileSync(process.env.GITHUB_OUTPUT, `download-path=${dest}\n`);
}

main().catch((e) => {
  console.log(`::error::download: ${e.message}`);
  process.exitCode = 1;
});
