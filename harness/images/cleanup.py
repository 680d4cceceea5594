"""`python -m harness cleanup`: a CI job's teardown on a self-hosted runner.

Terms:
  job containers   containers labelled `kiln.job=<job id>` (harness.commands.container_argv; the id is
                   settings().job_id: KILN_JOB_ID, else GitHub's run id, attempt and runner name), removed.
  stale containers containers of any CI job (label `kiln.job`; a kiln image's own labels, which every container
                   of it inherits, do not count) created longer ago than the grace period: no job can still
                   own them (a job ends within its `timeouts.job_min`), removed.
  keep-list        per image repository of the matrix (`kiln-cpu`, `kiln-cuda`, `kiln-rocm`), the tag the matrix
                   and this tree hash to now (harness.images.image.current_tag), for every backend.
  superseded tag   any other tag of those repositories, unless created or used (a container started from it,
                   `mark_used`) within the grace period: another runner on the same daemon may be running
                   another tree's image. Removed with `docker image rm` (never forced: an image a container
                   still runs stays), with its compile-cache folders (harness.commands.compile_cache_dir).
  grace period     the longest job timeout of the matrix (`--grace-min`).
Base images (the bootstrapped `kiln-base/...`, pulled bases) are never touched.
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harness import matrix as matrix_mod
from harness import trust
from harness.commands import JOB_LABEL
from harness.docker_client import docker, require_docker
from harness.exc import DockerError, HarnessError
from harness.settings import settings


@dataclass(frozen=True)
class LocalImage:
    """A tag of one of the matrix's image repositories, present locally."""

    repo: str
    tag: str
    created: float  # seconds since the epoch

    @property
    def ref(self) -> str:
        return f"{self.repo}:{self.tag}"


def superseded(
    images: Iterable[LocalImage],
    keep: Mapping[str, str | None],
    *,
    now: float,
    grace_s: float,
    used: Mapping[str, float] | None = None,
) -> list[str]:
    """The refs to remove: tags of the repositories in `keep` other than `keep[repo]` (its current full ref),
    unless created or used within `grace_s` of `now`; a repository whose current tag is unknown (None) keeps
    every tag. Sorted."""
    used = used or {}
    out = []
    for img in images:
        if img.repo not in keep or keep[img.repo] is None or img.ref == keep[img.repo]:
            continue
        last = max(img.created, used.get(img.ref, 0.0))
        if now - last < grace_s:
            continue
        out.append(img.ref)
    return sorted(out)


def current_tags(m: matrix_mod.Matrix) -> dict[str, str | None]:
    """The keep-list: each backend image repository -> the tag the matrix and the tree hash to now (None when
    it cannot be computed: nothing of that repository is pruned)."""
    from harness.images import image

    keep: dict[str, str | None] = {}
    for b in m.backends.values():
        try:
            keep[b.image] = image.current_tag(b)
            own = trust.scoped_image(b.image, settings().cache_scope)
            if own != b.image:  # a job of branch, pr or fork prunes its scope's own builds only, never main's
                current = keep.pop(b.image)
                keep[own] = trust.scoped_image(current, settings().cache_scope) if current else None
        except HarnessError as e:
            print(
                f"harness cleanup: keeping every {b.image} tag: its current tag is unknown ({e})", flush=True
            )
            keep[b.image] = None
    return keep


def _epoch(text: str) -> float:
    """docker's `CreatedAt` (`2026-11-25 17:46:51 +0000 UTC`) or RFC 3339 `Created` as epoch seconds."""
    text = re.sub(r"\s+[A-Z]{2,5}$", "", text.strip())
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    for fmt in ("%Y-%m-%d %H:%M:%S %z", None):
        try:
            return (datetime.strptime(text, fmt) if fmt else datetime.fromisoformat(text)).timestamp()
        except ValueError:
            continue
    return time.time()  # unreadable: as if new, so it is kept


def local_images(repos: Iterable[str]) -> list[LocalImage]:
    """The local tags of `repos`."""
    out = []
    for repo in repos:
        proc = docker("image", "ls", repo, "--format", "{{.Repository}}\t{{.Tag}}\t{{.CreatedAt}}")
        for line in proc.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[0] == repo and parts[1] != "<none>":
                out.append(LocalImage(parts[0], parts[1], _epoch(parts[2])))
    return out


# ---- use marks --------------------------------------------------------------------------------------------


def marks_dir() -> Path:
    return settings().data_dir / "images" / "used"


def _mark_name(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", ref)


def mark_used(ref: str) -> None:
    """Note that a container starts from image `ref` now (a file's mtime in the lasting data folder)."""
    try:
        folder = marks_dir()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _mark_name(ref)).touch()
    except OSError:
        pass  # a mark is an optimisation of the grace period, never a reason to fail a run


def last_used(refs: Iterable[str]) -> dict[str, float]:
    out = {}
    for ref in refs:
        try:
            out[ref] = (marks_dir() / _mark_name(ref)).stat().st_mtime
        except OSError:
            continue
    return out


# ---- containers -------------------------------------------------------------------------------------------


def containers(label: str) -> list[tuple[str, float]]:
    """(id, created) of every container, running or not, with `label` (`key` or `key=value`)."""
    ids = docker("ps", "-a", "-q", "--no-trunc", "--filter", f"label={label}").stdout.split()
    if not ids:
        return []
    proc = docker("inspect", "--format", "{{.Id}}\t{{.Created}}", *ids, check=False)
    out = []
    for line in proc.stdout.splitlines():
        cid, _, created = line.partition("\t")
        out.append((cid, _epoch(created)))
    return out


def remove_containers(ids: Iterable[str], dry_run: bool) -> int:
    ids = list(ids)
    if ids and not dry_run:
        docker("rm", "--force", *ids, check=False)
    return len(ids)


# ---- the verb ---------------------------------------------------------------------------------------------


def grace_default(m: matrix_mod.Matrix) -> float:
    """The longest job timeout of the matrix, in seconds."""
    return 60.0 * max((b.timeouts.job_min for b in m.backends.values()), default=90)


def cleanup(*, job: str, images: bool, grace_s: float, dry_run: bool = False) -> list[str]:
    """Remove the job's and stale containers, then superseded image tags and their compile caches; returns
    one line per action."""
    m = matrix_mod.load()
    now = time.time()
    verb = "would remove" if dry_run else "removed"
    lines = []
    if job:
        n = remove_containers((cid for cid, _ in containers(f"{JOB_LABEL}={job}")), dry_run)
        lines.append(f"{verb} {n} container(s) of job {job}")
    else:
        lines.append("no job id (KILN_JOB_ID, GITHUB_RUN_ID): no job containers to remove")
    stale = [cid for cid, created in containers(JOB_LABEL) if now - created > grace_s]
    lines.append(
        f"{verb} {remove_containers(stale, dry_run)} stale kiln container(s) older than "
        f"{grace_s / 60:.0f} min"
    )
    if not images:
        lines.append("image tags left alone (--no-images or KILN_PRUNE_IMAGES=0)")
        return lines
    keep = current_tags(m)
    found = local_images(keep)
    doomed = superseded(found, keep, now=now, grace_s=grace_s, used=last_used(i.ref for i in found))
    kept = sorted(i.ref for i in found if i.ref not in doomed)
    for ref in doomed:
        if dry_run:
            lines.append(f"would remove image {ref}")
            continue
        proc = docker("image", "rm", ref, check=False)
        if proc.returncode != 0:
            lines.append(f"kept image {ref}: {(proc.stderr.strip().splitlines() or ['in use'])[-1]}")
            continue
        lines.append(f"removed image {ref}")
        _remove_caches(ref)
    lines.append(f"kept {len(kept)} image(s): {', '.join(kept) or 'none'}")
    return lines


def _remove_caches(ref: str) -> None:
    """The compile-cache folders of image `ref` in every trust scope."""
    from harness.commands import compile_cache_dir

    s = settings()
    root = s.compile_cache
    if root is None or not root.is_dir():
        return
    # main's teardown clears the image's folders of every scope; any other scope's, only its own
    for scope in root.iterdir() if s.cache_scope in ("main", "local") else [root / s.cache_scope]:
        folder = compile_cache_dir(root, scope.name, ref)
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--job",
        help="the job whose containers to remove (default: KILN_JOB_ID, else GitHub's "
        "<run id>-<attempt>-<runner name>)",
    )
    p.add_argument(
        "--no-images", action="store_true", help="leave the image tags alone (also KILN_PRUNE_IMAGES=0)"
    )
    p.add_argument(
        "--grace-min",
        type=float,
        help="keep what was created or used this recently (default: the matrix's longest job timeout)",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")


def cli_main(args: argparse.Namespace) -> int:
    """A job's teardown: its containers and stale ones removed, superseded kiln image tags pruned (the current
    ones, for every backend of the matrix, kept)."""
    try:
        require_docker()
    except (
        DockerError
    ) as e:  # the error's advice (start dockerd, or --native) is for the verbs that need docker
        reason = re.split(r"; start it| or run natively| or install docker|: install docker", str(e))[0]
        print(f"harness cleanup: nothing to clean: {reason}", flush=True)
        return 0
    if args.grace_min is not None and args.grace_min < 0:
        raise HarnessError(f"--grace-min {args.grace_min}: expected 0 or more minutes")
    grace_s = grace_default(matrix_mod.load()) if args.grace_min is None else 60.0 * args.grace_min
    s = settings()
    for line in cleanup(
        job=args.job or s.job_id,
        images=s.prune_images and not args.no_images,
        grace_s=grace_s,
        dry_run=args.dry_run,
    ):
        print(f"harness cleanup: {line}", flush=True)
    return 0
