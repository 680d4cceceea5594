"""The actions a rehearsal maps the workflows' pinned remote actions to: our own (ci/rehearse/actions/: checkout
copies this tree; upload-artifact and download-artifact are small node actions over the real artifact client,
@actions/artifact, which `artifact_client` installs from the npm registry into a scratch folder), or built copies of
the real actions at their pinned commits where a machine has them (`--actions DIR`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from rehearsal.plan import RehearseError

ACTIONS_DIR = Path(__file__).resolve().parents[1] / "actions"
# remote action (owner/repo) -> its stand-in folder under ACTIONS_DIR
STAND_INS = {
    "actions/checkout": "checkout",
    "actions/upload-artifact": "upload-artifact",
    "actions/download-artifact": "download-artifact",
}


# the real artifact client behind our upload/download actions: the npm packages and versions the pinned
# upload-artifact v4.6.2 and download-artifact v4.3.0 are built on; @azure/storage-blob held at 12.17 (newer ones
# drop the `=` padding of the signed upload URL's `sig`, which act's artifact server then refuses as unauthorized)
ARTIFACT_CLIENT = {
    "name": "kiln-rehearse-artifact-client",
    "private": True,
    "dependencies": {"@actions/artifact": "2.3.2", "@actions/glob": "0.5.0", "minimatch": "9.0.5"},
    "overrides": {"@azure/storage-blob": "12.17.0"},
}


def artifact_client(folder: Path) -> Path:
    """The node_modules folder holding ARTIFACT_CLIENT, installed with npm into `folder` unless it holds it already
    (its package.json is ARTIFACT_CLIENT); RehearseError (one line) when node or npm is missing or npm fails."""
    modules, manifest = folder / "node_modules", folder / "package.json"
    want = json.dumps(ARTIFACT_CLIENT, indent=1) + "\n"
    if modules.is_dir() and manifest.is_file() and manifest.read_text(encoding="utf-8") == want:
        return modules
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RehearseError(
            "node and npm are needed for the artifact client (@actions/artifact): install them "
            "(Debian: apt-get install nodejs npm)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    manifest.write_text(want, encoding="utf-8")
    print(
        f"rehearse: npm install (the artifact client: {ARTIFACT_CLIENT['dependencies']}) into {folder}",
        flush=True,
    )
    proc = subprocess.run(
        [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        manifest.unlink()
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RehearseError(f"npm install of the artifact client failed (exit {proc.returncode}): {last[0]}")
    return modules


def local_repository_args(uses: list[str], actions_dir: Path, real: Path | None = None) -> list[str]:
    """`--local-repository OWNER/REPO@REF=DIR` for every remote `uses`, DIR its stand-in, or `real`/OWNER/REPO where
    that holds a built copy of the real action (its action.yml); an action with neither is a RehearseError (the job
    would need the network)."""
    args = []
    for u in uses:
        target, sep, ref = u.partition("@")
        repo = "/".join(target.split("/")[:2])
        if sep and real is not None and (real / repo / "action.yml").is_file():
            args += ["--local-repository", f"{repo}@{ref}={real / repo}"]
            continue
        if not sep or repo not in STAND_INS:
            raise RehearseError(
                f"no local stand-in for {u} (ci/rehearse/actions/ has {', '.join(STAND_INS)})"
            )
        folder = actions_dir / STAND_INS[repo]
        if not (folder / "action.yml").is_file():
            raise RehearseError(f"stand-in {folder}/action.yml is missing")
        args += ["--local-repository", f"{repo}@{ref}={folder}"]
    return args


# the real actions/checkout needs a token input (github.token, which act leaves empty): one that opens nothing
CHECKOUT_TOKEN = "rehearsal-not-a-token"


def real_checkout(real: Path | None) -> bool:
    """Whether `--actions DIR` holds a built copy of actions/checkout (then it replaces our checkout)."""
    return real is not None and (real / "actions" / "checkout" / "action.yml").is_file()


def serve_checkout(home: Path, root: Path, repository: str) -> None:
    """In the runner's home `home`: git's `url.file://ROOT.insteadOf https://github.com/REPOSITORY`, so that the real
    actions/checkout (which keeps the runner's git configuration) fetches the job's commit from this tree's repository,
    offline. It checks out that commit (HEAD): uncommitted changes are not rehearsed then."""
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text(
        f'[url "file://{root}"]\n\tinsteadOf = https://github.com/{repository}\n', encoding="utf-8"
    )
