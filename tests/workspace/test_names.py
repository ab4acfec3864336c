"""Names resolve through vecmerge.yaml or folders; expressions evaluate exactly in factored form."""

import pytest
import torch

from vecmerge.errors import AlignmentError, ExpressionError, WorkspaceError
from vecmerge.testing import llm_shapes, toy_adapter
from vecmerge.workspace.names import Workspace


def test_names_resolve_and_evaluate_exactly(toy):
    ws = Workspace()
    assert ws.path_of("v54") == (toy / "v54").resolve()
    tv = ws.evaluate("v54 + 0.5*(v51 - v28)")
    a = {n: ws.adapter(n) for n in ("v54", "v51", "v28")}
    for m in tv:
        ref = a["v54"].factors(m).dense() + 0.5 * (a["v51"].factors(m).dense() - a["v28"].factors(m).dense())
        torch.testing.assert_close(tv[m].dense(), ref, rtol=1e-12, atol=1e-14)


def test_workspace_file_relative_paths(tmp_path, monkeypatch):
    toy_adapter(tmp_path / "runs" / "a1")
    (tmp_path / "ws.yaml").write_text("adapters:\n  alpha1: runs/a1\n")
    monkeypatch.chdir(tmp_path / "runs")
    ws = Workspace(tmp_path / "ws.yaml")
    assert ws.path_of("alpha1") == (tmp_path / "runs" / "a1").resolve()
    assert ws.path_of("a1") == (tmp_path / "runs" / "a1").resolve()  # a folder in the cwd
    with pytest.raises(ExpressionError, match="'nope' is not an adapter name"):
        ws.path_of("nope")


@pytest.mark.parametrize("text, match", [
    ("adapters: [a, b]\n", "'adapters' must map names"),
    ("adapters: {a-b: x}\n", "must match"),
    ("adaptors: {a: x}\n", "unknown key"),
    ("adapters: {a: [\n", "not valid YAML"),
])
def test_bad_workspace(tmp_path, text, match):
    (tmp_path / "vecmerge.yaml").write_text(text)
    with pytest.raises(WorkspaceError, match=match):
        Workspace(root=tmp_path)


def test_different_bases_and_missing_modules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    toy_adapter("a", shapes=llm_shapes(2, 32, 48, 4, 2, 8))
    toy_adapter("b", shapes=llm_shapes(2, 64, 48, 4, 2, 16))
    toy_adapter("c", shapes=llm_shapes(1, 32, 48, 4, 2, 8))
    ws = Workspace()
    with pytest.raises(AlignmentError, match="different base models"):
        ws.evaluate("a - b")
    with pytest.raises(AlignmentError, match="c lacks 7 module.*--allow-missing"):
        ws.evaluate("a - c")
    tv = ws.evaluate("a - c", allow_missing=True)
    m = "model.layers.1.mlp.up_proj"
    torch.testing.assert_close(tv[m].dense(), ws.adapter("a").factors(m).dense(), rtol=0, atol=0)


def test_entries_with_parents_evidence_metric_and_gate(tmp_path):
    (tmp_path / "vecmerge.yaml").write_text(
        "adapters:\n  v28: {path: runs/v28, parent: null}\n  v51: {path: runs/v51, parent: v28}\n  v54: runs/v54\n"
        "evidence: data/ledger.db\nmetric: official_total\ngate: {max_trust: 0.02}\n")
    ws = Workspace(root=tmp_path)
    assert ws.adapters["v51"] == (tmp_path / "runs" / "v51").resolve() and ws.adapters["v54"].name == "v54"
    assert ws.parents == {"v28": None, "v51": "v28"}
    assert ws.lineage() == ({"v51": "v28"}, {"v28"})
    assert ws.ledger_path == (tmp_path / "data" / "ledger.db").resolve()
    assert (ws.metric, ws.gate) == ("official_total", {"max_trust": 0.02})
    (tmp_path / "vecmerge.yaml").write_text("adapters: {a: x}\n")
    assert Workspace(root=tmp_path).ledger_path == tmp_path / "vecmerge-evidence.db"  # beside the workspace
    assert Workspace(root=tmp_path / "elsewhere").ledger_path == tmp_path / "elsewhere" / "vecmerge-evidence.db"


def test_every_bad_entry_is_reported_at_once(tmp_path):
    (tmp_path / "vecmerge.yaml").write_text(
        "adapters:\n  a: {path: x, parnet: b}\n  b: {parent: a}\n  c: {path: y, parent: c-1}\n"
        "  d: {path: z, parent: d}\n  e: 3\nmetric: ''\ngate: 5\n")
    with pytest.raises(WorkspaceError) as info:
        Workspace(root=tmp_path)
    msg = str(info.value)
    assert "7 problems" in msg and "\n" not in msg
    for part in ("adapters.a: unknown key(s) ['parnet'] (use path, parent and replicate_of)", "adapters.b: path: None",
                 "adapters.c: parent: 'c-1'",
                 "adapters.d: parent: d is its own parent", "adapters.e: 3 must be a folder", "metric: ''",
                 "gate: 5 must be a mapping"):
        assert part in msg


def test_lineage_of_vecmerge_outputs_comes_from_their_manifest(toy):
    from vecmerge.pipeline import run
    from vecmerge.recipe.recipe import Recipe

    ws = Workspace()
    run(Recipe.from_dict({"base": "v54", "dir": "v51 - v28", "trust": 0.01, "out": "v58"}), ws)
    run(Recipe.from_dict({"base": "v58", "dir": "v51 - v28", "trust": 0.01, "out": "v61"}), ws)
    run(Recipe.from_dict({"base": "0.5*v28 + 0.5*v54", "out": "avg"}), ws)
    parents, roots = Workspace().lineage(["v61", "avg"])
    assert (parents["v61"], parents["v58"]) == ("v58", "v54") and "avg" not in parents and roots == set()
    (toy / "vecmerge.yaml").write_text("adapters:\n  v58: {path: v58, parent: v51}\n")  # declared wins
    assert Workspace().lineage(["v61"])[0] == {"v58": "v51", "v61": "v58"}


def test_content_sha_and_current_shas(toy):
    from vecmerge.peft.adapter import Adapter
    from vecmerge.workspace.names import UNREADABLE

    ws = Workspace()
    assert ws.content_sha("v51") == Adapter(toy / "v51").content_sha256
    assert ws.content_sha("v59") is None  # no such folder: published scores of weights not on disk
    (toy / "v54" / "adapter_config.json").unlink()
    ws = Workspace()
    assert ws.current_shas(["v54", "v51", "v59"]) == {"v54": UNREADABLE, "v51": Adapter(toy / "v51").content_sha256,
                                                      "v59": None}


def test_replicates_of_one_configuration_form_a_group(tmp_path):
    (tmp_path / "vecmerge.yaml").write_text(
        "adapters:\n  v54: runs/v54\n  v54b: {path: runs/v54-seed2, replicate_of: v54}\n"
        "  v54c: {path: runs/v54-seed3, replicate_of: v54b}\n  v51: runs/v51\n")
    ws = Workspace(root=tmp_path)
    assert ws.replicate_of == {"v54b": "v54", "v54c": "v54b"}
    assert ws.replicate_groups() == {"v54": ("v54", "v54b", "v54c")}  # a replicate of a replicate: the same group


@pytest.mark.parametrize("entry, match", [
    ("{path: x, replicate_of: v99}", "replicate_of: v99 is not an adapter of this workspace"),
    ("{path: x, replicate_of: a}", "adapters.a: replicate_of: a is itself"),
    ("{path: x, replicate_of: 'no spaces'}", "replicate_of: 'no spaces' must be an adapter name"),
])
def test_bad_replicate_of(tmp_path, entry, match):
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  a: {entry}\n  b: y\n")
    with pytest.raises(WorkspaceError, match=match):
        Workspace(root=tmp_path)


def test_a_cycle_of_replicates_or_of_parents_is_refused_naming_it(tmp_path):
    from vecmerge.errors import LineageError

    (tmp_path / "vecmerge.yaml").write_text("adapters:\n  a: {path: x, replicate_of: b}\n"
                                            "  b: {path: y, replicate_of: a}\n")
    with pytest.raises(LineageError, match=r"replicate_of cycle: a -> b -> a \(fix the replicate_of: keys"):
        Workspace(root=tmp_path).replicate_groups()
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n  a: {path: x, parent: b}\n  b: {path: y, parent: c}\n"
                                            "  c: {path: z, parent: a}\n")
    with pytest.raises(LineageError, match=r"lineage cycle: a -> b -> c -> a"):
        Workspace(root=tmp_path).lineage()


def test_no_key_of_the_workspace_or_its_gate_takes_a_direction(tmp_path):
    """Issue 23: ``higher_is_better: "yes"`` was taken as a direction; no workspace or gate key is one, so it is
    refused as unknown (directions come from --higher-is-better, lm-eval's booleans and the ledger)."""
    from vecmerge.evidence.gate.gate import GateConfig, GateConfigError

    (tmp_path / "vecmerge.yaml").write_text("adapters: {a: x}\nhigher_is_better: 'yes'\n")
    with pytest.raises(WorkspaceError, match=r"unknown key\(s\) \['higher_is_better'\]"):
        Workspace(root=tmp_path)
    with pytest.raises(GateConfigError, match="higher_is_better: unknown key"):
        GateConfig.from_dict({"higher_is_better": "yes"})
