"""Task vectors: alignment of adapters' modules, and refusals when adapters cannot be combined."""

from vecmerge.testing import llm_shapes, toy_adapter


def test_adapters_of_different_models_are_refused_even_with_allow_missing(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    toy_adapter("qwen", shapes=llm_shapes(1, 32, 48, 4, 2, 8))
    toy_adapter("gpt", shapes={"transformer.h.0.attn.c_attn": (96, 32)}, seed=1)
    res = run_cli("refactor", "qwen + gpt", "--out", "o", "--allow-missing")
    assert res.exit_code == 2 and "share no module" in res.output
