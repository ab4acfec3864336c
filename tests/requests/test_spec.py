"""Requests check themselves whole: every problem at once, whether made from flags, a file or by code."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from vecmerge.errors import UsageError
from vecmerge.requests import EvidenceCalibrate, EvidenceCompare, EvidencePlan, Rank, Request, Search
from vecmerge.requests.spec import spec_of


def test_every_problem_is_reported_at_once_in_field_order_then_relations():
    with pytest.raises(UsageError) as e:
        EvidencePlan("v51", "v51", min_effect=-1.0, max_runs=3, alpha=2.0, look_every=5)
    assert str(e.value) == ("--min-effect -1.0: a difference > 0; --alpha 2.0: between 0 and 1, e.g. 0.05; "
                            "--look-every 5: between 1 and --max-runs; evidence plan: A and --vs are both v51")
    assert e.value.exit_code == 2


def test_one_problem_reads_as_before_and_code_gets_the_same_checks_as_flags():
    with pytest.raises(UsageError, match=r"^--detect -1.0: a difference > 0$"):
        EvidenceCompare("v51", "v28", detect=-1.0)
    with pytest.raises(UsageError, match=r"^--margin inf: a difference > 0 in the metric's units$"):
        EvidenceCompare("v51", "v28", margin=float("inf"))
    assert EvidenceCompare("v51", "v28", detect=float("inf")).detect == float("inf")  # --detect allows it, as before


def test_text_that_cannot_be_read_is_reported_with_the_checks_of_the_other_fields():
    given = {f.name: f.default for f in dataclasses.fields(EvidenceCalibrate)}
    with pytest.raises(UsageError) as e:
        EvidenceCalibrate.from_flags({**given, "proxy": "a,,b", "target": "t", "min_models": 2})
    assert str(e.value) == ("--proxy 'a,,b': give metric names separated by commas, each once; --min-models 2: at "
                            "least 3 (a rank correlation needs 3 models)")
    made = EvidenceCalibrate.from_flags({**given, "proxy": " p1, p2", "target": "t"})
    assert made.proxy == ("p1", "p2") and made.loo is False and made.env == ()


def test_relations_are_checked_after_the_text_is_read():
    given = {f.name: f.default for f in dataclasses.fields(Rank)}
    with pytest.raises(UsageError, match=r"^rank: --target t is also a --proxy; rank by another metric; rank: name "
                       r"each candidate once \(got a, a\)$"):
        Rank.from_flags({**given, "candidates": ("a", "a"), "proxy": "p,t", "target": "t"})


@pytest.mark.parametrize("request_type", Request.__subclasses__())
def test_every_field_is_declared_once_with_a_flag_or_as_an_argument(request_type):
    for f in dataclasses.fields(request_type):
        s = spec_of(f)
        assert s.flag is None or s.flag.startswith("--"), (request_type.__name__, f.name)
        assert s.flag is None or s.help is None or s.help.strip(), (request_type.__name__, f.name)
    assert request_type.__doc__ and request_type.__doc__.strip(), request_type.__name__


def test_requests_import_neither_torch_nor_click():
    code = "import sys, vecmerge.requests; print('torch' in sys.modules, 'click' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ------------------------------------------------------------------ a request read from a mapping (a recipe file)
SEARCH_FLAGS = {"base": "a", "dirs": ("b - a", "c - a"), "target": ("t=t.jsonl",),
                "protect": ("p=p.jsonl", "q=q.jsonl"), "margin": ("p=0.1", "q=0.25"), "trust_max": 0.5,
                "budget": 7, "seed": 3, "sampler": "grid",
                "top_k": 2, "depth": True, "types": False, "exclude": ("mlp",), "energies": "0,0.9",
                "base_model": "base", "batch": 4, "workers": 0, "out_dir": "out", "resume": True, "force": False,
                "as_json": False}
SEARCH_KEYS = {"base": "a", "dir": ["b - a", "c - a"], "target": {"t": "t.jsonl"}, "protect": {"p": "p.jsonl",
               "q": "q.jsonl"}, "margin": {"p": 0.1, "q": 0.25}, "trust_max": 0.5, "budget": 7, "seed": 3,
               "sampler": "grid", "top": 2, "depth": True, "exclude_choice": ["mlp"], "energies": [0, 0.9],
               "base_model": "base", "batch": 4, "out_dir": "out", "resume": True}


def test_a_mapping_gives_the_request_its_flags_give():
    assert Search.from_mapping(SEARCH_KEYS, "s.yaml", root=".") == Search.from_flags(SEARCH_FLAGS)
    keys = {k: v for k, v in SEARCH_KEYS.items() if k not in ("dir", "trust_max")}
    made = Search.from_mapping({**keys, "margin": 0.1, "dirs": "b - a", "trust-max": 2}, "s.yaml")
    assert (made.margin, made.dirs, made.trust_max, made.recipe) == (0.1, ("b - a",), 2.0, None)


def test_relative_paths_start_from_the_files_folder_and_expressions_are_left_alone():
    made = Search.from_mapping({**SEARCH_KEYS, "target": {"t": "/abs/t.jsonl"}}, "r/s.yaml", root="r")
    assert made.protect == {"p": "r/p.jsonl", "q": "r/q.jsonl"} and made.target == {"t": "/abs/t.jsonl"}
    assert (made.base_model, made.out_dir) == ("r/base", "r/out")
    assert (made.base, made.dirs) == ("a", ("b - a", "c - a"))


def test_every_problem_of_a_mapping_is_one_line_naming_the_file_and_each_key():
    keys = {**SEARCH_KEYS, "trust": 1, "budget": "ten", "sampler": "gird", "force": True, "dirs": ["x"],
            "depth": "yes", "top": 0, 3: 4}
    del keys["base"]
    with pytest.raises(UsageError) as e:
        Search.from_mapping(keys, "s.yaml")
    assert str(e.value) == (
        "s.yaml: budget: expected an integer, got 'ten'; sampler 'gird': one of auto, grid, tpe (did you mean "
        "'grid'?); top 0: write at least 1 candidate; depth: expected true or false, got 'yes'; unknown key 'trust' "
        "(did you mean 'trust_max'?); force: give --force on the command line, not in a file; dirs: given twice "
        "(also as dir), keep one; unknown key 3 (the keys: base, dir, target, protect, margin, trust_max, budget, "
        "seed and 11 more); no base: give base: in the file or --base")
    assert e.value.exit_code == 2
    with pytest.raises(UsageError, match=r"^s.yaml: margin 'x': give a number .*; energies 'a,b': give numbers "
                                         r"separated by commas, e\.g\. 0,0\.9,0\.99$"):
        Search.from_mapping({**SEARCH_KEYS, "margin": "x", "energies": "a,b"}, "s.yaml")
    with pytest.raises(UsageError, match=r"^s.yaml: expected a mapping of keys \(base, dir, target, \.\.\.\), got "
                                         r"\['base'\]$"):
        Search.from_mapping(["base"], "s.yaml")
    with pytest.raises(UsageError, match=r"^s.yaml: no dir: give dir: in the file or --dir$"):  # given empty
        Search.from_mapping({**SEARCH_KEYS, "dir": []}, "s.yaml")


def test_the_checks_across_fields_run_on_a_mapping_too_in_any_request():
    with pytest.raises(UsageError, match=r"^f.yaml: detect -1\.0: a difference > 0$"):  # the check, in the file's key
        EvidenceCompare.from_mapping({"a": "v51", "b": "v28", "detect": -1}, "f.yaml")
    with pytest.raises(UsageError, match=r"^f.yaml: evidence plan: A and --vs are both v51$"):
        EvidencePlan.from_mapping({"a": "v51", "vs": "v51", "min_effect": 0.1, "max_runs": 3}, "f.yaml")
    assert EvidenceCalibrate.from_mapping({"proxy": ["p1", "p2"], "target": "t"}, "f.yaml").proxy == ("p1", "p2")


def test_a_file_is_read_bounded_its_sha256_kept_and_flags_typed_beside_it_replace_its_keys(tmp_path):
    import hashlib

    import yaml

    from vecmerge.io.parse import ParseError

    (tmp_path / "r").mkdir()
    path = tmp_path / "r" / "s.yaml"
    path.write_text(yaml.safe_dump(SEARCH_KEYS))
    made = Search.from_flags({**dict.fromkeys(SEARCH_FLAGS), "recipe": str(path), "seed": 9, "margin": ("0.3",)},
                             typed=["recipe", "seed", "margin"])
    assert (made.seed, made.margin, made.budget) == (9, 0.3, 7)
    assert made.target == {"t": str(path.parent / "t.jsonl")}
    assert made.recipe.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and made.recipe.path == str(path)
    assert made.recipe.overridden == ("margin", "seed") and set(made.recipe.keys) == set(SEARCH_KEYS)
    path.write_text("base: &x a\ndir: [*x]\n")
    with pytest.raises(ParseError, match=r"s\.yaml:1: anchor \(&x\) is not allowed"):
        Search.from_file(path)
