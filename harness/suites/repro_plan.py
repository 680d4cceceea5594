"""The plan of `harness repro`: how a run's failing tests are rerun here, and what cannot match. Pure: the
facts of this machine come in as `Here`, nothing is run or read.

Terms:
  Here        this machine as the plan needs it: whether a docker daemon answers, its GPU models, the versions of
              the Python that runs native reruns, whether the run's commit is in the repository, whether the
              run's image is present, and the tag the commit's image inputs hash to here (None: not computed).
  ReproPlan   the rerun: mode (native or container), the image to run (and whether to build it first), the
              tests, the environment (the run's, its seeds last), and the differences.
  difference  one short phrase per thing that cannot match the run (mode, commit, dirty tree, image, GPU,
              versions); `differs_line` joins them into the ONE line the command prints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.exc import ResultsError
from harness.suites.repro_source import RunSource

NATIVE, CONTAINER = "native", "container"


@dataclass(frozen=True)
class Here:
    """This machine's facts (module docstring)."""

    docker: bool = False
    gpus: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    has_commit: bool = True
    head: str | None = None  # the repository's HEAD, for --here
    image_present: bool = False
    rebuild_tag: str | None = None


@dataclass(frozen=True)
class ReproPlan:
    """The rerun (module docstring)."""

    mode: str
    targets: tuple[str, ...]
    env: Mapping[str, str]
    image: str | None = None
    build: bool = False
    here_tree: bool = False  # rerun in the repository's own tree (no checkout of the run's commit)
    drop_gpus: bool = False  # container: no GPU here, the run's GPU options are left out
    differences: tuple[str, ...] = ()


def gpu_phrase(gpus: Sequence[str]) -> str:
    """`2x NVIDIA H100 80GB HBM3` (several models joined by `+`), `no GPU` for none."""
    if not gpus:
        return "no GPU"
    return " + ".join(f"{n}x {name}" for name, n in Counter(gpus).items())


def gpu_difference(run: Sequence[str], here: Sequence[str], backend: str) -> str | None:
    """The GPU phrase when this machine's GPUs differ from the run's (model or count); None when they match or
    the run used none (a cpu run does not care)."""
    if not run or sorted(run) == sorted(here):
        return None
    return f"GPU: the run had {gpu_phrase(run)}, here {gpu_phrase(here)}" + (
        f" (backend {backend} tests may skip or fail)" if not here else ""
    )


def version_differences(run: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """`torch 2.11.0 here, 2.13.0 in the run` for every version both sides know and that differs."""
    return [
        f"{k} {here[k]} here, {run[k]} in the run"
        for k in ("python", "torch", "triton", "cuda", "hip")
        if run.get(k) and here.get(k) and run[k] != here[k]
    ]


def choose_mode(src: RunSource, here: Here, force_native: bool) -> tuple[str, str | None]:
    """(mode, the difference it makes or None): the run's own mode when this machine can; a container run with no
    docker daemon here, or `--native`, reruns natively."""
    ran = src.record.mode or NATIVE
    if force_native and ran == CONTAINER:
        return NATIVE, "mode: native as asked (--native), the run was in a container"
    if ran == CONTAINER and not here.docker:
        return NATIVE, "mode: native here (no docker daemon answers), the run was in a container"
    return (NATIVE if force_native else ran), None


def choose_image(src: RunSource, here: Here) -> tuple[str | None, bool, str | None]:
    """(the image to run, whether to build it, the difference or None) of a container rerun: the run's image
    when present; else rebuilt when the commit's inputs still hash to its tag; else the tag they hash to now."""
    recorded = (src.record.image or {}).get("tag")
    if recorded and here.image_present:
        return str(recorded), False, None
    if here.rebuild_tag is None:
        raise ResultsError(
            f"no image for the container rerun: {recorded or 'the run recorded none'} is not here "
            "and the commit's image tag could not be computed"
        )
    if not recorded:
        return here.rebuild_tag, True, f"image: the run recorded none; the commit's is {here.rebuild_tag}"
    if here.rebuild_tag == recorded:
        return str(recorded), True, None
    return (
        here.rebuild_tag,
        True,
        (
            f"image: {recorded} cannot be rebuilt here (the commit's inputs hash to "
            f"{here.rebuild_tag}: another base image or lock), {here.rebuild_tag} is used"
        ),
    )


def commit_differences(src: RunSource, here: Here, use_here: bool) -> list[str]:
    """What the tree that reruns the tests lacks of the run's: a commit not in the repository (an error unless
    `use_here`), a dirty tree, no commit recorded."""
    sha = src.commit
    out: list[str] = []
    if sha is None:
        out.append(f"commit: the run recorded none, this checkout's HEAD {(here.head or '?')[:12]} is tested")
    elif use_here:
        out.append(
            f"commit: this checkout's tree (HEAD {(here.head or '?')[:12]}) instead of the run's {sha[:12]}"
        )
    elif not here.has_commit:
        raise ResultsError(
            f"commit {sha[:12]} of the run is not in this repository: fetch it (git fetch origin "
            f"{sha}), give --repo DIR, or --here to rerun on this checkout as it is"
        )
    commit = src.record.commit or {}
    if commit.get("dirty"):
        files = list(commit.get("dirty_files") or ())
        named = f" ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})" if files else ""
        out.append(f"tree: the run's checkout had uncommitted changes{named} that {sha and sha[:12]} lacks")
    return out


def plan(
    src: RunSource, here: Here, env: Mapping[str, str], *, force_native: bool = False, use_here: bool = False
) -> ReproPlan:
    """The rerun of `src`'s failing tests on this machine (module docstring). `env`: the suites' environment,
    the run's own (its record's `env`, then its `seeds`) or, for a store run, the commit's matrix's."""
    if not src.failing:
        raise ResultsError("nothing to reproduce: the run has no failing tests")
    diffs = commit_differences(src, here, use_here)
    mode, why = choose_mode(src, here, force_native)
    diffs += [why] if why else []
    image, build = None, False
    if mode == CONTAINER:
        image, build, why = choose_image(src, here)
        diffs += [why] if why else []
    gpu = gpu_difference(src.gpus, here.gpus, src.record.backend)
    diffs += [gpu] if gpu else []
    if mode == NATIVE:
        diffs += version_differences(src.versions, here.versions)
    if src.from_store:
        diffs.append("environment: the commit's matrix (the store keeps no run environment)")
    targets = tuple(dict.fromkeys(f.id for f in src.failing))
    return ReproPlan(
        mode,
        targets,
        dict(env),
        image,
        build,
        use_here or src.commit is None,
        mode == CONTAINER and bool(src.gpus) and not here.gpus,
        tuple(diffs),
    )


def run_env(src: RunSource, matrix_env: Mapping[str, str]) -> dict[str, str]:
    """The rerun's environment: the run's recorded `env` (the commit's matrix's `matrix_env` when the run recorded
    none) with its `seeds` applied last."""
    env = dict(src.record.env) if src.record.env else dict(matrix_env)
    return {**env, **src.record.seeds}


def differs_line(p: ReproPlan) -> str:
    """The ONE line that says what cannot match the run, or that everything does."""
    if not p.differences:
        return "differs: nothing: same commit, mode, image and hardware as the run"
    return "differs: " + "; ".join(p.differences)


def outcome_line(reproduced: int, total: int) -> str:
    """The command's last line."""
    return f"reproduced: {reproduced} of {total} failing test(s) fail again"
