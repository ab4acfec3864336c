"""``merge --config`` against mergekit itself: files that leave mergekit's defaults out, and mergekit's own examples.

mergekit 0.1.5 (the optional extra ``mergekit``; skipped without it) is the oracle twice over: its
``MergeConfiguration`` and ``evaluate_setting`` resolve each module's parameters from the very YAML (gradients
over the layers, filters), and ``merge_tensors`` merges the dense updates (read without vecmerge) with the base at
the origin, its global generator seeded with ``module_seed(seed, module)`` so that DARE draws the same masks.
The examples are mergekit's files verbatim (tests/fixtures/mergekit), their models LoRA folders of the same
names, written in float32 (--dtype fp32 over their float16). Tolerance: relative Frobenius 1e-6 per module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from vecmerge.linalg.merge_kernels import module_seed
from vecmerge.testing import toy_adapter

api = pytest.importorskip("mergekit.merge_methods.api", reason="mergekit is an optional test-only oracle",
                         exc_type=ImportError)
config = pytest.importorskip("mergekit.config", exc_type=ImportError)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mergekit"
LAYERS = 40  # gradient-slerp.yml takes layers [0, 40)
SHAPES = {f"model.layers.{i}.{k}": s for i in range(LAYERS)
          for k, s in (("self_attn.q_proj", (6, 6)), ("mlp.up_proj", (8, 6)))}
MODELS = ("psmathur/orca_mini_v3_13b", "garage-bAInd/Platypus2-13B", "WizardLM/WizardMath-13B-V1.0",
          "WizardLM/WizardLM-13B-V1.2")
W3 = [0.5, -1.0, 2.0]
DENS = [0.5, 0.3, 0.7]


def rel(x, ref):
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


@pytest.fixture
def examples(tmp_path, monkeypatch):
    for i, name in enumerate(MODELS):
        toy_adapter(tmp_path / name, shapes=SHAPES, rank=2, seed=10 + i)
    for f in FIXTURES.glob("*.yml"):
        (tmp_path / f.name).write_text(f.read_text())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _setting(params, key, module: str, t: float):
    """mergekit's own value of ``key`` for ``module`` at ``t`` (its ``evaluate_setting`` on the parsed file)."""
    return config.evaluate_setting(f"{module}.weight", params[key], t, validate=lambda v: v)


def test_mergekit_example_ties_with_gradients_and_filters(examples, run_cli, dense_updates):
    """examples/ties.yml: a density gradient, a weight gradient and a weight filter, one module at a time."""
    res = run_cli("merge", "--config", "ties.yml", "--rank", "exact", "--dtype", "fp32", "--out", "out")
    assert res.exit_code == 0, res.output
    cfg = config.MergeConfiguration.model_validate(yaml.safe_load((examples / "ties.yml").read_text()))
    X = [dense_updates(examples / m.model.model.path) for m in cfg.models]
    got = dense_updates(examples / "out")
    assert set(got) == set(SHAPES)
    for m, x in got.items():
        t = int(m.split(".")[2]) / (LAYERS - 1)
        w = [float(_setting(e.parameters, "weight", m, t)) for e in cfg.models]
        d = [float(_setting(e.parameters, "density", m, t)) for e in cfg.models]
        want = api.merge_tensors([torch.zeros_like(X[0][m]), *(xi[m] for xi in X)], "ties",
                                 parameters={"weight": w, "density": d, "normalize": True}, base_index=0)
        assert rel(x, want) <= 1e-6, (m, w, d, rel(x, want))


def test_mergekit_example_gradient_slerp(examples, run_cli, dense_updates):
    """examples/gradient-slerp.yml: t over 40 layers, by filter (self_attn, mlp) and a fallback."""
    res = run_cli("merge", "--config", "gradient-slerp.yml", "--dtype", "fp32", "--out", "out")
    assert res.exit_code == 0, res.output
    assert "config note: slerp: mergekit interpolates the full weights" in res.output
    cfg = config.MergeConfiguration.model_validate(yaml.safe_load((examples / "gradient-slerp.yml").read_text()))
    first, second = (dense_updates(examples / s.model.model.path) for s in cfg.slices[0].sources)
    got = dense_updates(examples / "out")
    for m, x in got.items():
        t = float(_setting(cfg.parameters, "t", m, int(m.split(".")[2]) / (LAYERS - 1)))
        want = api.merge_tensors([first[m], second[m]], "slerp", parameters={"t": t}, base_index=0)
        assert rel(x, want) <= 1e-6, (m, t, rel(x, want))


def test_mergekit_example_linear(examples, run_cli, dense_updates):
    res = run_cli("merge", "--config", "linear.yml", "--dtype", "fp32", "--out", "out")
    assert res.exit_code == 0, res.output
    cfg = config.MergeConfiguration.model_validate(yaml.safe_load((examples / "linear.yml").read_text()))
    X = [dense_updates(examples / e.model.model.path) for e in cfg.models]
    w = [e.parameters["weight"] for e in cfg.models]
    for m, x in dense_updates(examples / "out").items():
        assert rel(x, api.merge_tensors([xi[m] for xi in X], "linear", parameters={"weight": w})) <= 1e-6, m


@pytest.fixture
def three(tmp_path, monkeypatch):
    for i, n in enumerate("abc"):
        toy_adapter(tmp_path / n, rank=4, seed=1 + i)
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n  a: a\n  b: b\n  c: c\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("method,extra", [("ties", ""), ("dare_ties", ""), ("dare_linear", ""),
                                          ("dare_linear", "  rescale: false\n")])
def test_config_that_leaves_normalize_out_is_mergekits_merge(three, run_cli, dense_updates, method, extra):
    """Item 2 of issue 36: no normalize (nor rescale) key means mergekit's defaults, so the same update as
    mergekit on the same file; over 6 seeds for DARE (whose update norm was 0.69x mergekit's: PEFT's divisor,
    the count of agreeing models, where mergekit's dare_ties sums)."""
    models = "".join(f"  - {{model: {n}, parameters: {{weight: {w}, density: {d}}}}}\n"
                     for n, w, d in zip("abc", W3, DENS))
    (three / "c.yml").write_text(f"merge_method: {method}\nmodels:\n{models}parameters:\n  int8_mask: true\n{extra}")
    D = {n: dense_updates(three / n) for n in "abc"}
    params = {"weight": W3, "density": DENS, **({"rescale": False} if extra else {})}
    seeds = range(6) if method.startswith("dare") else [0]
    ratios = []
    for seed in seeds:
        seeded = ("--seed", seed) if method.startswith("dare") else ()
        res = run_cli("merge", "--config", "c.yml", "--rank", "exact", *seeded, "--out", f"o{seed}")
        assert res.exit_code == 0, res.output
        for m, x in dense_updates(three / f"o{seed}").items():
            torch.manual_seed(module_seed(seed, m))
            want = api.merge_tensors([torch.zeros_like(x), *(D[n][m] for n in "abc")], method, parameters=params,
                                     base_index=0)
            assert rel(x, want) <= 1e-6, (seed, m, rel(x, want))
            ratios.append(float(x.norm() / want.norm()))
    assert max(abs(r - 1.0) for r in ratios) <= 1e-6
