"""Requests check themselves whole: every problem at once, whether made from flags or by code."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from vecmerge.errors import UsageError
from vecmerge.requests import EvidenceCalibrate, EvidenceCompare, EvidencePlan, Rank, Request
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
