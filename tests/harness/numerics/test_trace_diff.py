"""`harness numerics trace-diff`: two value traces of kiln runs (on the suites' device: the CPU interpreter here),
the first launch that diverges named with its source; traces that do not align, and bad trace files, refused in
one line (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from numerics_helpers import harness, one_error_line

from compiler import config
from compiler.runtime import value_trace
from harness.numerics import trace_diff as td
from harness.numerics.trace_records import Launch, LaunchKind, TraceOutput, TraceStats
from kiln_testing import DEVICE

ROOT = Path(__file__).resolve().parents[3]
PLANTED = 2  # the launch whose output is changed in the planted trace (the GELU kernel, between two matmuls)


def block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    h = torch.nn.functional.gelu(h @ w1)
    return torch.softmax(h @ w2, -1)


def other(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.relu(x @ w1) @ w2, -1)


def _inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g).to(DEVICE, dtype) for s in ((16, 32), (32, 48), (48, 24)))


def _trace(path: Path, fn=block, dtype: torch.dtype = torch.float32, plant=None) -> Path:
    """``fn`` compiled by kiln and run once with tracing into ``path`` (``plant``: a change of launch PLANTED)."""
    torch._dynamo.reset()
    with config.patch(trace_values=True, trace_file=str(path)):
        compiled = torch.compile(fn, backend="kiln")
        if plant is None:
            compiled(*_inputs(dtype))
        else:
            with value_trace.planted(0, PLANTED, plant):
                compiled(*_inputs(dtype))
    value_trace.close(str(path))
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("traces")
    return {
        "a": _trace(base / "a.jsonl"),
        "b": _trace(base / "b.jsonl"),
        "planted": _trace(base / "planted.jsonl", plant=lambda t: t.mul_(1.001)),
        "tiny": _trace(base / "tiny.jsonl", plant=lambda t: t.add_(1e-7)),
        "other": _trace(base / "other.jsonl", fn=other),
        "fp64": _trace(base / "fp64.jsonl", dtype=torch.float64),
    }


def _cli(*args: object) -> subprocess.CompletedProcess:
    """`python -m harness numerics trace-diff ARGS` in a real process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "harness", "numerics", "trace-diff", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_planted_divergence_is_named_with_its_source(traces, tmp_path):
    """One kernel's output changed by 0.1%: trace-diff names that launch (not the later ones it spoils), the
    statistic that moved, and prints the kernel's source from the trace; exit 1."""
    a = td.load(traces["a"])
    planted = a.launches[PLANTED]
    assert planted.kind is LaunchKind.TRITON and len(a.launches) > PLANTED + 1
    later = td.load(traces["planted"]).launches[PLANTED + 1 :]
    assert all(
        o.stats.digest != p.stats.digest
        for r, s in zip(a.launches[PLANTED + 1 :], later)
        for o, p in zip(r.outputs, s.outputs)
    )  # the change reaches every later launch
    proc = _cli(traces["a"], traces["planted"], "--json", tmp_path / "r.json")
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert f"first divergence at launch #{PLANTED} graph 0 " in out and f"triton {planted.kernel}" in out
    assert f"launches before it ({PLANTED}): bitwise identical" in out
    assert f"def {planted.kernel}(" in out and "@triton.jit" in out  # the source, from the trace
    result = json.loads((tmp_path / "r.json").read_text())
    div = result["divergence"]
    assert (div["seq"], div["kernel_a"], div["kind"]) == (PLANTED, planted.kernel, "triton")
    first = div["findings"][0]
    assert first["diff"] > first["allowed"] and first["stat"] in td.STATS
    assert out.splitlines()[3].startswith(f"  output {first['output']} ")


def test_identical_runs_and_changes_within_tolerance(traces, capsys):
    """Two runs of one program (kiln's graph names differ between them: graph indices align them) are bitwise
    identical; a change far below fp32's tolerance is reported as the first bitwise difference, exit 0."""
    a, b = td.load(traces["a"]), td.load(traces["b"])
    assert a.launches[0].graph != b.launches[0].graph
    rc, out, err = harness(capsys, "numerics", "trace-diff", traces["a"], traces["b"])
    assert rc == 0, err
    assert f"no divergence beyond tolerance in {len(a.launches)} aligned launches; bitwise identical" in out
    rc, out, err = harness(capsys, "numerics", "trace-diff", traces["a"], traces["tiny"])
    assert rc == 0, err
    assert f"first bitwise difference (within tolerance) at #{PLANTED} " in out
    rc, out, err = harness(capsys, "numerics", "trace-diff", traces["a"], traces["tiny"], "--rtol", "0")
    assert rc == 1 and f"first divergence at launch #{PLANTED} " in out


def test_misaligned_traces_one_line_exit_2(traces):
    proc = _cli(traces["a"], traces["other"])
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("harness numerics: error: the traces do not align at launch #0: ")
    assert proc.stdout == ""


def test_fp64_upcast_run_compares_only_when_allowed(traces, capsys):
    """An fp64 run of the same program has other kernel sources and dtypes: refused unless --allow-source-diff,
    then within fp32's tolerance of the fp32 run."""
    rc, _, err = harness(capsys, "numerics", "trace-diff", traces["a"], traces["fp64"])
    assert "kernel sources differ: --allow-source-diff compares them anyway" in one_error_line(rc, err)
    rc, out, err = harness(
        capsys, "numerics", "trace-diff", traces["a"], traces["fp64"], "--allow-source-diff"
    )
    assert rc == 0, out + err
    assert "no divergence beyond tolerance" in out


def test_truncated_trace(traces, tmp_path, capsys):
    """A traced process that died: its cut-off last line is left out with a note; fewer launches than the other
    trace, and all agreeing, is no comparison (exit 2)."""
    text = traces["a"].read_text()
    lines = text.splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]) + lines[-1][:40])
    t = td.load(cut)
    assert t.truncated and len(t.launches) == len(td.load(traces["a"]).launches) - 1
    rc, _, err = harness(capsys, "numerics", "trace-diff", traces["a"], cut)
    assert "the traces do not align: A has" in one_error_line(rc, err)
    rc, out, err = harness(capsys, "numerics", "trace-diff", traces["planted"], cut)
    assert rc == 1 and "cut-off line" in out and f"first divergence at launch #{PLANTED} " in out


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "no such trace file"),
        ("", "is empty: not a kiln value trace"),
        ("not json\n", ":1: not JSON"),
        ('{"type": "launch"}\n', "first line is no trace header"),
        ('{"type": "header", "schema": 99}\n', "trace schema 99, this harness reads schema 1"),
        ('{"type": "header", "schema": 1}\n{"type": "launch", "seq": 0}\n', ":2: launch record without"),
        ("[1, 2]\n", ":1: not a trace record"),
        (
            '{"type": "header", "schema": 1}\n{"type": "launch", "seq": 0, "graph": "g", "graph_index": 0, '
            '"call": 0, "launch": 0, "kind": "cuda", "kernel": "k", "source_hash": "h", "outputs": []}\n',
            ":2: launch kind 'cuda' is not one of triton, extern, fallback",
        ),
        (
            '{"type": "header", "schema": 1}\n{"type": "kernel", "source": "x"}\n',
            ":2: malformed kernel record",
        ),
    ],
)
def test_bad_trace_files(traces, tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.jsonl"
    if content is not None:
        bad.write_text(content)
    rc, _, err = harness(capsys, "numerics", "trace-diff", traces["a"], bad)
    assert needle in one_error_line(rc, err)


def test_source_from_a_dump_folder(traces, tmp_path):
    """A trace without kernel records: the source comes from a KILN_DUMP_DIR folder when its hash matches."""
    a = td.load(traces["a"])
    r = a.launches[PLANTED]
    src = a.sources[r.source_hash]
    a.sources.clear()
    assert td.source_of(a, r, None)[1] is None
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / f"{r.kernel}.py").write_text(src)
    assert td.source_of(a, r, tmp_path) == (f"from {tmp_path / 'kernels' / (r.kernel + '.py')}", src)
    (tmp_path / "kernels" / f"{r.kernel}.py").write_text(src + "# edited\n")
    assert "holds another source" in td.source_of(a, r, tmp_path)[0]


def bf16_chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.softmax((x * 1.7 + 0.3).exp() * x, -1) @ w).sin()


def test_a_setting_that_changes_the_math(tmp_path, capsys):
    """kiln vs kiln with emulate_eager_precision (bf16 rounding after every op): other kernel sources, so refused
    unless --allow-source-diff; then within bf16's tolerance, and at --rtol 0 the first kernel is named with the
    graph settings that differ and both sources."""
    g = torch.Generator().manual_seed(0)
    x, w = (torch.randn(*s, generator=g).to(DEVICE, torch.bfloat16) for s in ((16, 64), (64, 32)))
    paths = []
    for emulate in (False, True):
        torch._dynamo.reset()
        path = tmp_path / f"emulate-{emulate}.jsonl"
        with config.patch(trace_values=True, trace_file=str(path), emulate_eager_precision=emulate):
            torch.compile(bf16_chain, backend="kiln")(x, w)
        value_trace.close(str(path))
        paths.append(path)
    rc, _, err = harness(capsys, "numerics", "trace-diff", *paths)
    assert "kernel sources differ" in one_error_line(rc, err)
    rc, out, err = harness(capsys, "numerics", "trace-diff", *paths, "--allow-source-diff")
    assert rc == 0 and "first bitwise difference (within tolerance) at #0 " in out, out + err
    rc, out, err = harness(capsys, "numerics", "trace-diff", *paths, "--allow-source-diff", "--rtol", "0")
    assert rc == 1 and "first divergence at launch #0 " in out, out + err
    assert "graph settings: A (defaults); B emulate_eager_precision=True" in out
    assert [ln.split(" (")[1][0] for ln in out.splitlines() if ln.startswith("kernel source of ")] == [
        "A",
        "B",
    ]


def test_alignment_rules():
    """Launches align on graph index, graph role (a cond branch meets the same branch), call, launch and kind, and
    on output shapes; dtypes and sources only under --allow-source-diff."""
    out = TraceOutput("buf0", [4], "float32", TraceStats(4))
    a = Launch(3, "graph_0.true_graph_0", 1, 0, 0, LaunchKind.TRITON, "k", "h", [out])
    assert td.misalignment(a, replace(a, graph="graph_9.true_graph_0"), False) is None
    assert "B has #3 graph 1 (graph_0.false_graph_0)" in (
        td.misalignment(a, replace(a, graph="graph_0.false_graph_0"), False) or ""
    )
    assert "B has #3 graph 1 (graph_0.true_graph_0) call 1" in (
        td.misalignment(a, replace(a, call=1), False) or ""
    )
    assert "writes float32[4] in A and float32[5] in B" in (
        td.misalignment(a, replace(a, outputs=[replace(out, shape=[5])]), True) or ""
    )
    fp64 = replace(a, source_hash="g", outputs=[replace(out, dtype="float64")])
    assert "kernel sources differ" in (td.misalignment(a, fp64, False) or "")
    assert td.misalignment(a, fp64, True) is None
