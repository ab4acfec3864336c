"""``vecmerge verify`` of fuse and extract outputs (``verify.checks.models``, ``model_figures``): every file and every
figure of the manifest accounted for (issue 23's probes: a dotfile, an edited card, figures raised 1.5x passed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from vecmerge.models.extract_write import extract
from vecmerge.models.fuse import fuse
from vecmerge.testing import toy_adapter
from vecmerge.verify.checks.output import verify_output

Q = "model.layers.0.self_attn.q_proj"


def write_model(root, tensors: dict):
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "generation_config.json").write_text("{}")
    save_file(tensors, str(root / "model.safetensors"))
    return root


def base_tensors(seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {Q + ".weight": torch.randn(16, 8, generator=g), "model.layers.0.mlp.up_proj.weight":
            torch.randn(12, 8, generator=g), "model.norm.weight": torch.ones(8)}


@pytest.fixture
def fused(tmp_path):
    base = write_model(tmp_path / "base", base_tensors())
    toy_adapter(tmp_path / "a", shapes={Q: (16, 8), "model.layers.0.mlp.up_proj": (12, 8)}, rank=2, std=0.3)
    fuse(tmp_path / "a", base, tmp_path / "fz")
    assert verify_output(tmp_path / "fz")["passed"]
    return tmp_path / "fz"


@pytest.fixture
def extracted(tmp_path):
    b = base_tensors()
    t = {k: v + 0.1 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) if "proj" in k else v.clone()
         for k, v in b.items()}
    extract(write_model(tmp_path / "b", b), write_model(tmp_path / "t", t), tmp_path / "ex", rank="2")
    assert verify_output(tmp_path / "ex")["passed"]
    return tmp_path / "ex"


def failed(folder) -> dict:
    return {c["name"]: c["detail"] for c in verify_output(folder)["checks"] if not c["passed"]}


def edit_manifest(folder, fn) -> None:
    p = folder / "vecmerge.json"
    man = json.loads(p.read_text())
    fn(man)
    p.write_text(json.dumps(man))


@pytest.mark.parametrize("kind", ["fused", "extracted"])
@pytest.mark.parametrize("extra", ["dotfile", "dotdir", "file"])
def test_any_extra_entry_fails_the_files_check(request, kind, extra):
    out = request.getfixturevalue(kind)
    name = {"dotfile": ".x", "dotdir": ".cache", "file": "notes.txt"}[extra]
    (out / name).mkdir() if extra == "dotdir" else (out / name).write_text("x")
    bad = failed(out)
    assert set(bad) == {"files"} and f"{name} in {out} is not written by vecmerge" in bad["files"]


@pytest.mark.parametrize("kind", ["fused", "extracted"])
def test_an_edited_model_card_fails_against_its_pin(request, kind):
    out = request.getfixturevalue(kind)
    assert json.loads((out / "vecmerge.json").read_text())["output"]["card_sha256"]
    with open(out / "README.md", "a") as f:
        f.write("x\n")
    bad = failed(out)
    assert set(bad) == {"files"} and "the model card was edited after writing" in bad["files"]


def test_an_unpinned_card_of_an_older_manifest_is_not_failed(fused):
    edit_manifest(fused, lambda m: m["output"].pop("card_sha256"))
    assert verify_output(fused)["passed"]


@pytest.mark.parametrize("field, edit", [
    (f"modules.{Q}.delta_norm", lambda m: m["modules"][Q].update(delta_norm=m["modules"][Q]["delta_norm"] * 1.5)),
    (f"modules.{Q}.rounding_rel", lambda m: m["modules"][Q].update(rounding_rel=m["modules"][Q]["rounding_rel"] * 1.5)),
    ("figures.max_rounding_rel",
     lambda m: m["figures"].update(max_rounding_rel=m["figures"]["max_rounding_rel"] * 1.5)),
    ("figures.rounding_rel", lambda m: m["figures"].update(rounding_rel=m["figures"]["rounding_rel"] * 1.5)),
    ("figures.modules", lambda m: m["figures"].update(modules=3)),
    ("figures.copied", lambda m: m["figures"].update(copied=0)),
    (f"modules.{Q}.shape", lambda m: m["modules"][Q].update(shape=[8, 16])),
    ("figures.extra", lambda m: m["figures"].update(extra=1)),
])
def test_an_edited_fuse_figure_fails_naming_it(fused, field, edit):
    edit_manifest(fused, edit)
    bad = failed(fused)
    assert set(bad) == {"figures"} and bad["figures"].startswith(field), bad


def test_fuse_copied_files_must_be_the_bases(fused):
    edit_manifest(fused, lambda m: m["output"]["copied_files"].append(".x"))
    assert "output.copied_files is" in failed(fused)["copies"]


@pytest.mark.parametrize("field, edit", [
    ("dropped_energy", lambda r, f: r.update(dropped_energy=r["dropped_energy"] * 1.5)),
    ("kept_share", lambda r, f: r.update(kept_share=r["kept_share"] * 0.99)),
    ("total_energy", lambda r, f: r.update(total_energy=r["total_energy"] * 1.5)),
    ("rank", lambda r, f: r.update(rank=1)),
    ("figures.modules", lambda r, f: f.update(modules=21)),
    ("figures.total_energy", lambda r, f: f.update(total_energy=f["total_energy"] * 1.5)),
    ("figures.kept_share", lambda r, f: f.update(kept_share=f["kept_share"] * 0.99)),
    ("figures.others", lambda r, f: f.update(others=2)),
])
def test_an_edited_extract_figure_fails_naming_it(extracted, field, edit):
    edit_manifest(extracted, lambda m: edit(m["modules"][Q], m["figures"]))
    bad = failed(extracted)
    assert "figures" in bad and set(bad) <= {"figures", "update"}, bad
    where = field if field.startswith("figures.") else f"modules.{Q}.{field}"
    assert bad["figures"].startswith(where) or f"; {where}" in bad["figures"], bad["figures"]
