"""Issue 36: no absolute local path in any file of an output folder, whatever command wrote it.

A workspace that names its adapters, its base model and the fine-tune by absolute path, with a hub id for the
base (``base_model_id``), writes a ``project``, a ``merge``, an ``extract`` and a ``fuse`` output; every byte of
every file of each folder is searched for the temporary folder's path (and its name). The outputs then verify
from another current folder: the relative paths are read back through the manifest's ``workspace``
(and, for an output copied elsewhere, through ``--workspace``).
"""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import save_file

from vecmerge.testing import toy_adapter

Q = "model.layers.0.self_attn.q_proj"


def _model(folder, weight: torch.Tensor):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({Q + ".weight": weight}, str(folder / "model.safetensors"))
    return folder


def test_no_absolute_path_in_any_file_of_a_project_merge_extract_or_fuse_output(tmp_path, monkeypatch, run_cli):
    w = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    base = _model(tmp_path / "models" / "base", w)
    tuned = _model(tmp_path / "models" / "tuned", w + 0.01 * torch.randn(16, 8, generator=torch.Generator()
                                                                         .manual_seed(1)))
    store, ws = tmp_path / "store", tmp_path / "ws"
    for i, n in enumerate(("v28", "v51", "v54")):
        toy_adapter(store / n, shapes={Q: (16, 8)}, rank=2, seed=i, base_model=str(base))
    ws.mkdir()
    (ws / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {n}: {store / n}\n" for n in ("v28", "v51", "v54"))
                                      + f"base_model: {base}\nbase_model_id: Org/tiny-base\n")
    monkeypatch.chdir(ws)
    outs = {"project": ws / "out" / "v58", "merge": tmp_path / "outs" / "m", "extract": tmp_path / "outs" / "x",
            "fuse": ws / "fused"}
    for args in (("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--out", outs["project"]),
                 ("merge", "--method", "linear", "v51", "v54", "--out", outs["merge"]),
                 ("extract", "--base-model", base, "--tuned", tuned, "--rank", "2", "--out", outs["extract"]),
                 ("fuse", "v54", "--out", outs["fuse"])):
        res = run_cli(*args)
        assert res.exit_code == 0, res.output
    for kind, out in outs.items():
        files = sorted(out.rglob("*"))
        assert len(files) >= 3, kind
        for f in files:
            data = f.read_bytes()
            assert str(tmp_path).encode() not in data and tmp_path.name.encode() not in data, (kind, f.name)
    for kind in ("project", "merge", "extract"):  # the LoRA outputs name the base by its hub id
        cfg = json.loads((outs[kind] / "adapter_config.json").read_text())
        assert cfg["base_model_name_or_path"] == "Org/tiny-base", kind
    x = json.loads((outs["extract"] / "vecmerge.json").read_text())
    assert x["workspace"] == "../../ws" and x["inputs"]["tuned"]["path"] == "../models/tuned"
    assert "base_model: Org/tiny-base" in (outs["extract"] / "README.md").read_text()
    f = json.loads((outs["fuse"] / "vecmerge.json").read_text())
    assert f["workspace"] == ".." and f["inputs"]["adapter"]["path"] == "../store/v54"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for kind, out in outs.items():
        res = run_cli("verify", out)
        assert res.exit_code == 0, (kind, res.output)
    moved = tmp_path / "a" / "b" / "x"  # an output copied out of its place: its workspace named again
    shutil.copytree(outs["extract"], moved)
    res = run_cli("verify", moved)
    assert res.exit_code != 0 and "if the output was moved or copied, pass --workspace" in " ".join(res.output.split())
    res = run_cli("verify", moved, "--workspace", ws / "vecmerge.yaml")
    assert res.exit_code == 0, res.output
