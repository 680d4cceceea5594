"""Does a local image match the matrix? (`python -m harness image --check`), pinning base images by digest
(`python -m harness image --pin`), and the `python -m harness image` command line (build, bootstrap, tag,
inputs, lock; harness/images/image.py and harness/images/lock.py do the work).

Check, per backend, one line: `ok`, `ok (warning: ...)` or `MISMATCH: reason; reason`. An image matches when
  - its lock file (docker/lock/<backend>.txt) exists and is current (made from today's pins);
  - the image tagged with today's hash exists locally: the hash covers the Dockerfile, the base reference
    (tag@digest when pinned), the base's local id when it is not pinned by digest, the lock and the project;
  - its labels carry the same inputs hash, lock digest and base digest.
A base image pinned by tag only is a warning, a failure under `--strict`. A bootstrapped base (debootstrap +
docker import) is recorded by its local image id: the suite and variant are pinned in the matrix, its
packages are whatever the Debian mirror serves that day.

Pin: `docker pull TAG`, then the repository digest docker recorded for it (`RepoDigests`), written into
ci/matrix.json's `base_digest` (the file's layout kept) and the Dockerfile's `ARG BASE_IMAGE=` default.
Needs a machine that reaches the registry; nothing is invented where the pull fails.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import matrix as matrix_mod
from harness.exc import HarnessError, ImageError
from harness.images import image
from harness.images import lock as lock_mod
from harness.matrix import DIGEST_RE, Backend
from harness.settings import settings


def short(digest: str | None) -> str:
    """`sha256:` and 12 hex digits (or `none`)."""
    if not digest or digest == "none":
        return "none"
    algo, _, hexes = digest.partition(":")
    return f"{algo}:{hexes[:12]}" if hexes else digest[:19]


@dataclass
class Verdict:
    """The check of one backend."""

    backend: str
    tag: str | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.problems:
            return f"{self.backend}: MISMATCH: " + "; ".join(
                self.problems + [f"warning: {w}" for w in self.warnings]
            )
        warn = "".join(f" (warning: {w})" for w in self.warnings)
        return f"{self.backend}: ok: {self.tag} {self.detail}{warn}"


def _label_problems(lab: dict[str, str], ref: str, expect: dict[str, str]) -> list[str]:
    """What `ref`'s labels say differently from `expect` (only the keys that make it hermetic)."""
    out = []
    if "kiln.lock-sha256" not in lab:
        return [f"{ref} has no kiln.lock-sha256 label (built before images were locked): rebuild it"]
    names = {
        "kiln.inputs-hash": "inputs hash",
        "kiln.lock-sha256": "lock",
        "kiln.base-digest": "base digest",
        "kiln.base-id": "base id",
    }
    for key, what in names.items():
        have, want = lab.get(key, ""), expect.get(key, "")
        if have != want:
            fmt = (lambda d: d or "none") if key == "kiln.inputs-hash" else short
            out.append(f"{ref} was built with {what} {fmt(have)}, the tree says {fmt(want)}")
    return out


def _other_images(backend: Backend) -> list[str]:
    """Local images of the backend (by label), newest first."""
    proc = image.docker(
        "image",
        "ls",
        "--filter",
        f"label=kiln.backend={backend.name}",
        "--format",
        "{{.Repository}}:{{.Tag}}",
        check=False,
    )
    return (
        [ln.strip() for ln in proc.stdout.splitlines() if ln.strip() and not ln.endswith(":<none>")]
        if proc.returncode == 0
        else []
    )


def check(backend: Backend, *, strict: bool = False, root: Path | None = None) -> Verdict:
    """Compare the backend's local image with the matrix and the tree (docker must be reachable)."""
    v = Verdict(backend.name)
    lock = lock_mod.state(backend, root)
    problem = lock.problem()
    if problem:
        v.problems.append(problem)
    base = image.local_base(backend)
    warning = image.unpinned_warning(backend, base)
    if warning:
        (v.problems if strict else v.warnings).append(warning)
    pinned = image.digest_pinned(backend, base)
    base_id = image.base_id_for_hash(backend, base)
    if not pinned and base_id is None:
        v.problems.append(
            f"base image {base} is not present locally (`python -m harness image build --backend "
            f"{backend.name}` pulls or bootstraps it)"
        )
        return v
    v.tag = image.image_tag(backend, base, root, base_id)
    expect = image.image_labels(backend, v.tag, base, base_id, root)
    if image.image_id(v.tag):
        v.problems += _label_problems(image.labels(v.tag), v.tag, expect)
    else:
        others = [t for t in _other_images(backend) if t != v.tag]
        why = ""
        if others:
            diff = _label_problems(image.labels(others[0]), others[0], expect)
            why = f" ({'; '.join(diff) if diff else 'newest local one: ' + others[0]})"
        v.problems.append(
            f"no local image {v.tag}{why}: build it with `python -m harness image build "
            f"--backend {backend.name}`"
        )
    base_what = f"digest {short(backend.base_digest)}" if pinned else f"id {short(base_id)}"
    v.detail = f"(base {base} {base_what}, lock {short(lock.digest)})"
    return v


def cli_check(args: Any) -> int:
    m = matrix_mod.load()
    backends = [m.backend(args.backend)] if args.backend else list(m.backends.values())
    image.require_docker()
    verdicts = [check(b, strict=args.strict) for b in backends]
    for v in verdicts:
        print(v.line())
    return 0 if all(v.ok for v in verdicts) else 1


# ---- pin: the base image's digest into the matrix --------------------------------------------------------


def _repository(tag: str) -> str:
    """`nvidia/cuda:13.0.1-...` -> `nvidia/cuda` (a registry's `host:port/` prefix kept)."""
    head, sep, last = tag.rpartition("/")
    return f"{head}{sep}{last.split(':', 1)[0]}"


def _same_repo(a: str, b: str) -> bool:
    def norm(name: str) -> str:
        for prefix in ("docker.io/library/", "docker.io/"):
            if name.startswith(prefix):
                name = name[len(prefix) :]
        return name.removeprefix("library/")

    return norm(a) == norm(b)


def resolve_digest(tag: str) -> str:
    """Pull `tag` and return the registry's digest of it (`sha256:...`): the repository digest docker
    recorded on pull. ImageError when the registry cannot be reached."""
    pulled = image.docker("pull", tag, check=False, timeout=900)
    if pulled.returncode != 0:
        tail = (pulled.stderr or "").strip().splitlines()[-1:]
        raise ImageError(
            f"cannot pull {tag} ({' '.join(tail) or 'no output'}): pinning needs a machine that "
            "reaches its registry"
        )
    proc = image.docker("image", "inspect", "--format", "{{json .RepoDigests}}", tag)
    digests = json.loads(proc.stdout.strip() or "null") or []
    mine = [d for d in digests if _same_repo(d.split("@", 1)[0], _repository(tag))]
    if not mine:
        raise ImageError(f"docker recorded no repository digest for {tag} (RepoDigests: {digests})")
    digest = mine[0].split("@", 1)[1]
    if not DIGEST_RE.fullmatch(digest):
        raise ImageError(f"unexpected digest {digest!r} for {tag}")
    return digest


def write_matrix_digest(path: Path, backend: str, digest: str) -> None:
    """Set `base_digest` of `backend` in the matrix file, keeping the rest of its text as it is."""
    text = path.read_text()
    data = json.loads(text)
    tag = data["backends"][backend]["base_image"]
    base = re.compile(r'^([ \t]*)"base_image":[ \t]*' + re.escape(json.dumps(tag)) + r",[ \t]*\n", re.M)
    starts = [mt for mt in base.finditer(text)]
    if not starts:
        raise ImageError(f"{path}: cannot find the base_image line of {backend}")
    out, pos = [], 0
    for mt in starts:  # every backend on this tag gets the digest: the same tag names the same content
        out.append(text[pos : mt.end()])
        pos = mt.end()
        existing = re.compile(r'[ \t]*"base_digest":[ \t]*(null|"[^"]*"),?[ \t]*\n').match(text, pos)
        if existing:
            pos = existing.end()
        out.append(f'{mt.group(1)}"base_digest": "{digest}",\n')
    out.append(text[pos:])
    new = "".join(out)
    matrix_mod.parse(json.loads(new), path)  # still valid before it is written
    path.write_text(new)


def write_dockerfile_default(path: Path, ref: str) -> None:
    """Set the Dockerfile's `ARG BASE_IMAGE=` default to `ref` (the defaults equal the matrix)."""
    text = path.read_text()
    new, n = re.subn(r"^ARG BASE_IMAGE=.*$", f"ARG BASE_IMAGE={ref}", text, count=1, flags=re.M)
    if not n:
        raise ImageError(f"{path}: no `ARG BASE_IMAGE=` line")
    path.write_text(new)


def pin(backend: Backend, root: Path | None = None, matrix_path: Path | None = None) -> str:
    """Resolve the backend's base tag to its digest and write it into the matrix and the Dockerfile."""
    root = root or settings().root
    digest = resolve_digest(backend.base_image)
    write_matrix_digest(matrix_path or settings().matrix_path, backend.name, digest)
    write_dockerfile_default(root / backend.dockerfile, f"{backend.base_image}@{digest}")
    return digest


def cli_pin(args: Any) -> int:
    m = matrix_mod.load()
    backends = [m.backend(args.backend)] if args.backend else list(m.backends.values())
    image.require_docker()
    failed = 0
    for b in backends:
        try:
            digest = pin(b)
        except ImageError as e:
            print(f"{b.name}: not pinned: {e}")
            failed += 1
            continue
        was = f" (was {short(b.base_digest)})" if b.base_digest and b.base_digest != digest else ""
        print(f"{b.name}: {b.base_image}@{digest}{was}")
    if not failed:
        print("review and commit ci/matrix.json and the Dockerfiles; images rebuild on the pinned bases")
    return 1 if failed else 0


# ---- CLI: `python -m harness image {build,bootstrap,tag,inputs,lock} | --check | --pin` -----------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=["build", "bootstrap", "tag", "inputs", "lock"],
        help="build: build if the hash tag is missing; bootstrap: make the base image; "
        "tag: print the hash tag; inputs: print what the hash covers; lock: write the backend's "
        "lock file with pip-compile under this Python (`nox -s lock` sets that up)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="say per backend whether the local image matches the matrix and the tree "
        "(tag hash, base digest, lock digest); exit 1 when one does not",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="pull each base image by its tag and write its digest into ci/matrix.json "
        "(base_digest) and the Dockerfile's BASE_IMAGE default; needs the registry",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="--check: a base image not pinned by digest fails the check (CI of the GPU images)",
    )
    p.add_argument("--backend", help="the backend (--check/--pin: default every backend of the matrix)")
    p.add_argument("--base-image", help="build on this image instead of the pinned/bootstrapped one")
    p.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    p.add_argument(
        "--bootstrap",
        action="store_true",
        default=None,
        help="bootstrap the base without trying to pull (also KILN_BOOTSTRAP=1)",
    )


def cli_main(args: Any) -> int:
    """Bootstrap the base image, build the hash-tagged backend image, check it against the matrix."""
    if args.check or args.pin:
        if args.action:
            raise HarnessError(f"give either the action {args.action!r} or --check/--pin, not both")
        return cli_check(args) if args.check else cli_pin(args)
    if not args.action or not args.backend:
        raise HarnessError(
            "give an action (build, bootstrap, tag, inputs, lock) and --backend B, or --check / --pin"
        )
    backend = matrix_mod.load().backend(args.backend)
    if args.action == "lock":
        state = lock_mod.write(backend)
        print(f"{state.rel} {state.digest}")
        return 0
    if args.action == "inputs":
        base = args.base_image or backend.base_ref
        for name, text in image.image_inputs(backend, base).items():
            print(f"== {name} ({hashlib.sha256(text.encode()).hexdigest()[:12]})")
        print("== base_id (the base's local image id unless it is pinned by digest; `image tag` looks it up)")
        return 0
    image.require_docker()
    if args.action == "tag":
        print(image.current_tag(backend, args.base_image))
        return 0
    if args.action == "bootstrap":
        print(image.bootstrap_base(backend, force=args.force))
        return 0
    img = image.build(backend, base_image=args.base_image, force=args.force, bootstrap=args.bootstrap)
    print(img.tag)
    return 0
