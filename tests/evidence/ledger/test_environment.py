"""Eval environments: canonical fields, an id that is stable across machines, field order and number spelling, and
the refusal to pool two environments (naming the fields that differ)."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.environment import (
    EnvChoice,
    Environment,
    canonical_fields,
    canonical_value,
    differing,
    environment_id,
    one_environment,
)
from vecmerge.evidence.ledger.records import Record

FIELDS = {"harness": "lm-eval", "temperature": 0.0, "max_tokens": 256, "stop": ["\n", "."], "timeout": "1800"}
# The canonical JSON written out by hand (keys sorted, every value as text, no spaces), and its sha256 computed by
# hashlib here: the id must be these 12 hex digits on every machine, whatever the order or spelling of the fields.
CANONICAL = '{"harness":"lm-eval","max_tokens":"256","stop":"[\\"\\\\n\\",\\".\\"]","temperature":"0","timeout":"1800"}'
ID = "549bd29ca3c7"


def test_the_id_is_the_sha256_of_the_canonical_json_written_by_hand():
    assert hashlib.sha256(CANONICAL.encode("ascii")).hexdigest()[:12] == ID
    assert environment_id(canonical_fields(FIELDS)) == ID
    assert Environment(canonical_fields(FIELDS)).id == ID


def test_the_id_does_not_depend_on_field_order():
    items = list(FIELDS.items())
    ids = {environment_id(canonical_fields(list(p))) for p in itertools.permutations(items)}
    assert ids == {ID}


@pytest.mark.parametrize("spelling", [0, 0.0, -0.0, "0", "0.0", " 0.00 ", "+0", "0e0"])
def test_one_number_however_it_is_spelled(spelling):
    assert canonical_value(spelling, "t") == "0"
    assert environment_id(canonical_fields({**FIELDS, "temperature": spelling})) == ID


def test_canonical_values():
    assert [canonical_value(v, "x") for v in (True, "TRUE", "false", 1.5, "1.50", 1e-5, "1e-05", 2**60)] == [
        "true", "true", "false", "1.5", "1.5", "1e-05", "1e-05", "1.152921504606847e+18"]
    assert canonical_value(["."], "stop") == "." and canonical_value([], "stop") is None  # one value is that value
    assert canonical_value(None, "x") is None and canonical_value("  ", "x") is None  # not recorded
    assert canonical_value("0.4.13", "v") == "0.4.13"
    assert canonical_value({"b": 1, "a": True}, "g") == '{"a":"true","b":"1"}'
    assert canonical_fields({"seed": None, "n_shot": 0}) == (("n_shot", "0"),)


@pytest.mark.parametrize("fields, match", [
    ({"bad key": 1}, "environment field 'bad key'"),
    ({"": 1}, "environment field ''"),
    ({"t": float("nan")}, "env.t: nan is not finite"),
    ({"t": "a\x1b[31m"}, "control character"),
    ({"t": "x" * 1001}, "at most 1000"),
    ({"t": object()}, "not a text, number or list"),
])
def test_bad_fields_are_refused_naming_them(fields, match):
    with pytest.raises(EvidenceError, match=match):
        canonical_fields(fields)


def test_a_field_given_twice_with_two_values_is_refused():
    with pytest.raises(EvidenceError, match=r"env.t: given twice \('0' and '1'\)"):
        canonical_fields([("t", 0), ("t", "1")])
    assert canonical_fields([("t", 0), ("t", "0.0")]) == (("t", "0"),)


def test_the_empty_environment_is_an_environment_of_its_own():
    assert Environment().id == hashlib.sha256(b"{}").hexdigest()[:12] == "44136fa355b3"
    assert Environment().describe() == "no fields recorded"


def test_differing_fields():
    a = Environment(canonical_fields({"harness": "lm-eval", "timeout": 180, "seed": 0}))
    b = Environment(canonical_fields({"harness": "lm-eval", "timeout": 900}))
    assert differing(a, b) == [("seed", "0", None), ("timeout", "180", "900")]


def rec(i, model, value, **env):
    return Record(i, model, None, "tb2", value, env=canonical_fields(env))


RECS = [rec(1, "v51", 0.463, timeout=180, harness="tb2"), rec(2, "v51", 0.47, timeout=180, harness="tb2"),
        rec(3, "v51", 0.6097, timeout=900, harness="tb2"), rec(4, "v28", 0.45, timeout=180, harness="tb2")]


def test_two_environments_are_not_the_same_measurement():
    """Terminal-Bench 2: a 5x task timeout moved one score from 46.3% to 60.97%; such runs are never pooled."""
    with pytest.raises(EvidenceError) as info:
        one_environment(RECS, None, "v51 and v28 on tb2")
    text = str(info.value)
    a, b = RECS[0].environment.id, RECS[2].environment.id
    assert text.startswith("v51 and v28 on tb2: not the same measurement: the records were made under 2 eval "
                           f"environments that differ in timeout (180 in {a}, 900 in {b})")
    assert f"{a} (v51 2, v28 1), {b} (v51 1)" in text and "--env ID or --env KEY=VALUE" in text and "\n" not in text


def test_a_choice_by_field_or_by_id_prefix_picks_one():
    env, kept = one_environment(RECS, EnvChoice.parse(["timeout=180"]), "x")
    assert [r.id for r in kept] == [1, 2, 4] and dict(env.fields)["timeout"] == "180"
    env, kept = one_environment(RECS, EnvChoice.parse([RECS[2].environment.id[:6]]), "x")
    assert [r.id for r in kept] == [3]
    env, kept = one_environment(RECS, EnvChoice.parse({"timeout": 900.0}), "x")  # a gate config's mapping
    assert [r.id for r in kept] == [3]
    with pytest.raises(EvidenceError, match=r"x: no record matches --env timeout=60; the records' environments"):
        one_environment(RECS, EnvChoice.parse(["timeout=60"]), "x")
    assert one_environment([], None, "x") == (None, [])


@pytest.mark.parametrize("option, match", [("zz", "give an environment id"), ("temperature=", "give a value"),
                                           ("bad key=1", "environment field 'bad key'")])
def test_bad_env_options(option, match):
    with pytest.raises(EvidenceError, match=match):
        EnvChoice.parse([option])
