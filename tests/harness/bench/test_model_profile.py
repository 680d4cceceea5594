"""`bench model-profile`: per-compiler step profiles of a real tiny model on CPU (kiln vs eager)."""

from __future__ import annotations

import pytest

from harness.bench import model_profile as mp
from harness.bench import models as mdl
from harness.bench.cli import main


@pytest.fixture
def transformers_present() -> None:
    problem = mdl.package_problem("transformers")
    if problem:
        pytest.skip(f"transformers is not importable: {problem}")


def test_profile_of_tiny_gpt2_names_kernels_and_kiln_graphs(tmp_path, transformers_present, capsys):
    md = tmp_path / "profile.md"
    rc = main(["model-profile", "--only", "model.gpt2.infer.fp32", "--compilers", "kiln,eager", "--device", "cpu",
               "--steps", "2", "--top", "5", "--md", str(md)])
    assert rc == 0
    text = md.read_text()
    assert "| model.gpt2.infer.fp32 | eager |" in text and "| model.gpt2.infer.fp32 | kiln |" in text
    assert "## model.gpt2.infer.fp32 under kiln" in text and "kiln graphs:" in text
    assert "`aten::" in text  # CPU: the innermost ATen ops are the work
    lines = capsys.readouterr().out.splitlines()
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("model.gpt2")) == ["eager", "kiln"]


def test_markdown_shares_and_host_bound_time():
    p = mp.Profile("model.x.infer.fp32", "kiln", step_ms=2.0, device_ms=0.5, launches=10,
                   top=[("k1", 0.4, 2.0), ("k2", 0.1, 1.0)], graphs=["3 kernels, fallbacks: none"])
    text = mp.markdown([p])
    assert "| model.x.infer.fp32 | kiln | 2.000 | 0.500 | 1.500 | 10 |" in text
    assert "| `k1` | 0.4000 | 80.0 | 2 |" in text and "- 3 kernels, fallbacks: none" in text


def test_unknown_case_is_a_usage_error(capsys):
    rc = main(["model-profile", "--only", "model.nope.*", "--device", "cpu"])
    assert rc == 2 and "no tiny model matches" in capsys.readouterr().err
