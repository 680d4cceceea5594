"""Rehearse the committed workflows with a real workflow runner: act (nektos/act) on this machine, offline.

`nox -s rehearse` runs this file. Each rehearsal job is one `act` run of one job of a committed workflow, as
the workflow defines it, in self-hosted host mode; act's own output is printed as it comes, then a summary
table (job, step, result) and the verdict: exit 1 when a job ended otherwise than expected.

Terms:
  host mode     act runs the steps on this machine, no job container: every `runs-on` label of the workflows
                is mapped to `-self-hosted` (`-P LABEL=-self-hosted`).
  stand-in      a local action under ci/rehearse/actions/ that does what the workflows rely on of a remote
                action: checkout copies this tree (composite); upload-artifact and download-artifact are small node
                actions of ours over the real artifact client, @actions/artifact (ARTIFACT_CLIENT: installed from the
                npm registry at rehearsal time into a scratch folder that NODE_PATH names, never committed), talking
                to act's artifact server, so names, paths, hidden files and the `artifact-url` output behave as on
                GitHub. act takes them through `--local-repository OWNER/REPO@REF=DIR` for every pinned `uses:` of
                the workflows, so no job needs the network. `--actions DIR` maps instead the built copies of the
                real actions that DIR holds (DIR/OWNER/REPO/action.yml, at the pinned commit), where a machine has
                them.
  artifact folder  act's artifact server folder (`--artifact-server-path`, bound to 127.0.0.1 only); each job x
                event starts with an empty run (act gives every run id 1).
  expected      `success` for CPU jobs; `preflight` for GPU jobs on a machine without a GPU: the job must
                fail at its first failing step with the harness's pre-flight line (`error: pre-flight B: ...`,
                harness/checks/preflight.py), and at its pre-flight step if the workflow has one (a step whose
                name or command says preflight / pre-flight); that line is the message.
  reduced       `--selection EXPR`: the workflows' `selection` input (KILN_TEST_SELECTION, a pytest -k
                expression), so the suites, the compile check and the flake runs take a few tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the `rehearsal` package beside this file

from rehearsal.run import main

if __name__ == "__main__":
    sys.exit(main())
