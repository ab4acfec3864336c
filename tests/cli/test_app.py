"""The CLI contract: inspect and refactor work; every refusal is one `error:` line, exit 2, nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vecmerge.testing import llm_shapes, toy_adapter

ROOT = Path(__file__).resolve().parents[2]


def test_inspect_table_and_json(toy, run_cli):
    res = run_cli("inspect", "v54", "v28")
    assert res.exit_code == 0, res.output
    assert "14 (2 layers x 7 types)" in res.output and "alpha/r" in res.output and "sha256" in res.output
    info = json.loads(run_cli("inspect", "v54", "--json").output)
    assert info["modules"] == 14 and info["ranks"] == {"8": 14} and info["dtype"] == "fp32"
    from vecmerge.workspace.names import Workspace

    tv = Workspace().vector("v54")
    assert info["norm"] == pytest.approx(tv.norm(), rel=1e-12)
    dense_q = sum(float((tv[m].dense() ** 2).sum()) for m in tv if m.endswith("q_proj")) ** 0.5
    assert info["norm_by_type"]["q_proj"] == pytest.approx(dense_q, rel=1e-10)



def test_inspect_module_count_is_a_grid_only_when_it_is_one(tmp_path, monkeypatch, run_cli):
    """A q/v adapter on layer 1 plus a down_proj on layers 0 and 1 (4 modules) is not "2 layers x 3 types"."""
    monkeypatch.chdir(tmp_path)
    shapes = {m: s for m, s in llm_shapes(2, 32, 48, 4, 2, 8).items()
              if m.endswith(("q_proj", "v_proj")) and ".1." in m or m.endswith("down_proj")}
    toy_adapter(tmp_path / "part", shapes=shapes)
    toy_adapter(tmp_path / "one", shapes={m: s for m, s in shapes.items() if ".1." in m})
    assert "4 (2 layers, 3 types)" in run_cli("inspect", "part").output
    assert "3 (1 layer x 3 types)" in run_cli("inspect", "one").output


def test_inspect_lists_modules_to_save_instead_of_refusing(tmp_path, monkeypatch, run_cli, dense_updates):
    """Issue 12 item 3: full modules saved as PEFT 0.21 writes them (``base_model.model.lm_head.weight``, no
    ``modules_to_save.default``) are listed by inspect, text and JSON, and left out of the norm (rel 1e-9 against
    the LoRA updates alone); the same folder is refused by refactor without --modules-to-save drop."""
    folder = toy_adapter(tmp_path / "h", extra_config={"modules_to_save": ["lm_head", "embed_tokens"]})
    sd = load_file(folder / "adapter_model.safetensors")
    saved = {"base_model.model.lm_head.weight": torch.randn(96, 32), "base_model.model.model.embed_tokens.weight":
             torch.randn(96, 32)}
    save_file({**sd, **saved}, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    monkeypatch.chdir(tmp_path)
    res = run_cli("inspect", "h")
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("modules_to_save"))
    assert "lm_head, embed_tokens: full trained weights (2 tensor(s)), not LoRA" in line
    info = json.loads(run_cli("inspect", "h", "--json").output)
    assert info["modules_to_save"] == ["lm_head", "embed_tokens"] and sorted(info["saved_modules"]) == sorted(saved)
    assert info["modules"] == 14
    want = sum(float((d**2).sum()) for d in dense_updates(folder).values()) ** 0.5
    assert info["norm"] == pytest.approx(want, rel=1e-9)
    res = run_cli("refactor", "h", "--out", "o")
    assert res.exit_code == 2 and "--modules-to-save drop" in res.output and not (tmp_path / "o").exists()

def test_refactor_exact_and_cut_report(toy, run_cli):
    res = run_cli("refactor", "0.5*v16", "--out", "x")
    assert res.exit_code == 2 and "'v16' is not an adapter name" in res.output
    res = run_cli("refactor", "0.5*v28 + 0.5*v54", "--rank", "exact", "--out", "avg", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    fig = rep["outputs"][0]["figures"]
    assert fig["rank"]["max"] <= 16 and fig["rel_error"] < 1e-6
    res = run_cli("refactor", "0.5*v28 + 0.5*v54", "--rank", "3", "--out", "avg3", "--json")
    fig = json.loads(res.output)["outputs"][0]["figures"]
    assert fig["rank"]["max"] == 3 and all(e["cut_error"] > 0 for e in fig["modules"].values())


def test_parse_error_shows_caret(toy, run_cli):
    res = run_cli("refactor", "v54 + * v28", "--out", "x")
    assert res.exit_code == 2
    assert res.output.splitlines()[1:] == ["  v54 + * v28", "        ^"]


def _corrupt(folder, how):
    p = folder / "adapter_model.safetensors"
    cfg = folder / "adapter_config.json"
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    if how == "no_config":
        cfg.unlink()
    elif how in ("ia3", "dora", "lora_bias", "modules_to_save"):
        c = json.loads(cfg.read_text())
        c.update({"ia3": {"peft_type": "IA3"}, "dora": {"use_dora": True}, "lora_bias": {"lora_bias": True},
                  "modules_to_save": {"modules_to_save": ["lm_head"]}}[how])
        cfg.write_text(json.dumps(c))
    elif how == "truncated":
        p.write_bytes(p.read_bytes()[:-100])
    elif how in ("nan", "shape"):
        sd = load_file(p)
        if how == "nan":
            sd[key][1, 2] = float("inf")
        else:
            sd[key] = torch.zeros(3, sd[key].shape[1])
        save_file(sd, p)


@pytest.mark.parametrize("how, match", [
    ("no_config", "no adapter_config.json"),
    ("ia3", "peft_type is IA3"),
    ("dora", "DoRA"),
    ("lora_bias", "lora_bias is set but"),  # read now; a config without its biases is not
    ("modules_to_save", "--modules-to-save drop"),
    ("truncated", "truncated or corrupt"),
    ("nan", "module model.layers.0.self_attn.q_proj: lora_A has 1 NaN/Inf"),
    ("shape", "disagree on the rank"),
])
def test_refusals_exit_2_one_line_nothing_written(toy, run_cli, how, match):
    _corrupt(toy / "v28", how)
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--out", "o")
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: ") and len(res.output.strip().splitlines()) == 1, res.output
    assert match in res.output and ("v28" in res.output)
    assert not (toy / "o").exists() and not list(toy.glob(".o.*"))
    assert "Traceback" not in res.output


def test_modules_to_save_drop(toy, run_cli):
    _corrupt(toy / "v28", "modules_to_save")
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--out", "o",
                  "--modules-to-save", "drop")
    assert res.exit_code == 0, res.output
    cfg = json.loads((toy / "o" / "adapter_config.json").read_text())
    assert cfg["modules_to_save"] is None


def test_different_bases_and_missing_modules(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    toy_adapter("a", shapes=llm_shapes(2, 32, 48, 4, 2, 8))
    toy_adapter("b", shapes=llm_shapes(2, 64, 48, 4, 2, 16), seed=1)
    toy_adapter("c", shapes=llm_shapes(1, 32, 48, 4, 2, 8), seed=2)
    res = run_cli("refactor", "a - b", "--out", "o")
    assert res.exit_code == 2 and "different base models" in res.output
    res = run_cli("refactor", "a - c", "--out", "o")
    assert res.exit_code == 2 and "c lacks 7 module(s)" in res.output and "--allow-missing" in res.output
    res = run_cli("refactor", "a - c", "--out", "o", "--allow-missing")
    assert res.exit_code == 0 and "missing modules treated as zero: c: 7" in res.output
    man = json.loads((tmp_path / "o" / "vecmerge.json").read_text())
    assert len(man["missing_modules"]["c"]) == 7


def test_help_is_fast_to_import():
    # vecmerge --help must not import torch (measured in `make bench`; here we check the cause).
    code = "import sys; from vecmerge.cli import main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("args, needle, where", [
    (("project", "--bogus", "1"), "No such option '--bogus'", "vecmerge project --help"),
    (("project", "--base", "v54"), "Missing option '--dir'", "vecmerge project --help"),
    (("merge", "--method", "nosuch", "v28", "v51", "--out", "o"), "Invalid value for '--method'",
     "vecmerge merge --help"),
    (("project", "--trust", "abc", "--base", "v54", "--dir", "v51-v28", "--out", "o"), "'abc' is not a valid float",
     "vecmerge project --help"),
    (("--bogus",), "No such option '--bogus'", "vecmerge --help"),
    (("nosuch",), "No such command 'nosuch'", "vecmerge --help"),
    (("evidence", "add"), "Missing argument 'NAME'", "vecmerge evidence add --help"),
])
def test_click_usage_errors_are_one_error_line(toy, run_cli, args, needle, where):
    """click's own parse errors follow the CLI contract too: one ``error:`` line, exit 2, nothing written
    (they were click's four-line "Usage: ... Error: ..." block; found by stranger2)."""
    res = run_cli(*args, prog_name="vecmerge")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert needle in lines[0] and f"see '{where}'" in lines[0], lines[0]
    assert not (toy / "o").exists()


def test_device_flag(toy, run_cli):
    res = run_cli("--device", "cpu", "inspect", "v54", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["modules"] == 14
    if not torch.cuda.is_available():
        res = run_cli("--device", "cuda", "inspect", "v54")
        assert res.exit_code == 2 and "no CUDA device" in res.output


def test_global_options_after_the_subcommand(toy, run_cli, tmp_path):
    """Issue 12 item 10: -q, --workspace, --debug and --device work after the subcommand too."""
    res = run_cli("inspect", "v54", "--json", "-q", "--device", "cpu")
    assert res.exit_code == 0 and json.loads(res.stdout)["modules"] == 14
    (tmp_path / "other.yaml").write_text(f"adapters: {{backbone: {toy / 'v54'}}}\n")
    res = run_cli("inspect", "backbone", "--workspace", tmp_path / "other.yaml", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["path"] == str(toy / "v54")
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "o", "-q")
    assert res.exit_code == 0, res.output
    with pytest.raises(Exception, match="v16"):  # --debug: the traceback instead of one line
        run_cli("refactor", "v16", "--out", "x", "--debug")
    if not torch.cuda.is_available():
        res = run_cli("inspect", "v54", "--device", "cuda")
        assert res.exit_code == 2 and "no CUDA device" in res.output


def test_every_command_takes_the_global_options():
    """A command added later (e.g. evidence show, ls, gate) gets -q/--workspace/--debug/--device after it too."""
    import click

    from vecmerge.cli import main

    def walk(group, path=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*path, name))
            else:
                yield " ".join((*path, name)), cmd

    for name, cmd in walk(main):
        flags = {f for p in cmd.params for f in getattr(p, "opts", [])}
        assert {"--workspace", "--debug", "--quiet", "-q", "--device"} <= flags, name


def test_every_option_has_help_and_the_recipe_is_documented():
    """Issue 12 item 11: help for every option, the modes explained, the recipe keys in run --help and
    docs/RECIPES.md (generated), refactor offering neither keep-base nor step-energy."""
    import click
    from click.testing import CliRunner

    from vecmerge.cli import main
    from vecmerge.recipe.docs import recipe_markdown, schema

    for name, cmd in main.commands.items():
        for prm in cmd.params:
            if isinstance(prm, click.Option) and prm.name != "help":
                assert prm.help and len(prm.help) > 10, (name, prm.name)
    runner = CliRunner()
    project = runner.invoke(main, ["project", "--help"]).output
    assert "99%" in project and "99%%" not in project
    assert "dir_m - (<dir_m, base_m> / ||base_m||^2) base_m" in " ".join(project.split())
    assert "step-energy:E" in project and "keep-base" in project
    refactor = runner.invoke(main, ["refactor", "--help"]).output
    assert "keep-base" not in refactor and "step-energy" not in refactor
    run_help = runner.invoke(main, ["run", "--help"]).output
    for key, _, _ in schema():
        assert f"  {key}: " in run_help, key
    assert {"base", "dir", "consensus", "rank", "base_model_id", "allow_base_mismatch"} <= {k for k, _, _ in schema()}
    assert (ROOT / "docs" / "RECIPES.md").read_text() == recipe_markdown()  # `make readme` regenerates it


@pytest.mark.parametrize("args, flag_msg", [
    (["--mode", "onto-ref"], "--mode onto-ref: needs --consensus-ref (the reference trajectory)"),
    (["--trust-scope", "module", "--alpha", "0.1"], "--trust-scope module: needs --trust"),
    (["--alpha", "0.1", "--rank", "energy:2"], "--rank 'energy:2': use 'exact'"),
])
def test_errors_name_the_flags_the_user_typed(toy, run_cli, args, flag_msg):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", *args, "--out", "o")
    assert res.exit_code == 2 and flag_msg in res.output, res.output
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--out", "o")
    assert "--trust or --alpha: one is needed with --dir" in res.output
    (toy / "r.yaml").write_text("base: v54\ndir: v51-v28\ntrust: 0.01\nmode: onto-ref\nout: o\n")
    assert "mode=onto-ref: needs consensus.ref" in run_cli("run", "r.yaml").output  # a recipe names its keys
    res = run_cli("refactor", "v54", "--rank", "step-energy:0.9", "--out", "o")
    assert res.exit_code == 2 and "refactor: --rank step-energy" in res.output


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path):
    """`vecmerge ... | head`: the reader goes away; no `error: BrokenPipeError` line, exit 141 (128 + SIGPIPE)."""
    script = (
        "import sys; from vecmerge.cli import main\n"
        "from vecmerge.cli.app import main as group, handled\n"
        "import click\n"
        "@group.command('flood')\n"
        "@handled\n"
        "def flood():\n"
        "    for i in range(200000):\n"
        "        click.echo('x' * 60)\n"
        "main(['flood'])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    with proc:
        proc.stdout.read(100)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == 141, err
    assert "error" not in err and "Traceback" not in err, err
