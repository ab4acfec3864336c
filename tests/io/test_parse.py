"""safe_parse / safe_pattern: every hostile input ends in one short ParseError line, fast.

Timing: pytest-timeout is not installed, so each hostile case measures ``time.monotonic()`` around
the call and asserts a bound of a couple of seconds (the unguarded cases ran 60-77 s or hung).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time

import pytest
import yaml

from vecmerge.errors import VecmergeError
from vecmerge.io.parse import ParseError, load_json, load_yaml, parse_json, parse_yaml, safe_path, short
from vecmerge.io.patterns import PatternError, PatternSet, check_pattern, pattern_matches

FAST_S = 2.0


def timed(fn, *args, **kwargs):
    """(exception or result, seconds)."""
    t = time.monotonic()
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (returned for the test to inspect)
        out = e
    return out, time.monotonic() - t


def one_line_error(err, *, source: str, cls=ParseError, max_chars: int = 320):
    assert isinstance(err, cls), f"expected {cls.__name__}, got {err!r}"
    assert isinstance(err, VecmergeError) and err.exit_code == 2
    msg = str(err)
    assert "\n" not in msg and len(msg) <= max_chars, msg
    assert source in msg, msg
    return msg


# ----------------------------------------------------------------------------------------------- YAML
def alias_bomb(levels: int = 9) -> str:
    """The classic 'billion laughs': level k is a list of 9 aliases of level k-1 (9**9 ~ 3.9e8 leaves)."""
    lines = ['a0: &a0 ["lol"]']
    for k in range(1, levels + 1):
        lines.append(f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_fast(tmp_path):
    p = tmp_path / "recipe.yaml"
    p.write_text(alias_bomb())
    assert len(p.read_bytes()) < 1024
    err, seconds = timed(load_yaml, p)
    msg = one_line_error(err, source=str(p))
    assert seconds < FAST_S
    assert err.line == 1 and "anchor (&a0)" in msg and "not allowed" in msg


def test_yaml_lone_alias_and_anchor_are_refused():
    err, _ = timed(parse_yaml, "base: &b runs/v54\nother: x\n", "ws.yaml")
    assert "anchor (&b)" in one_line_error(err, source="ws.yaml") and err.line == 1
    # an alias of an undefined anchor: refused by the same rule before PyYAML looks it up
    err, _ = timed(parse_yaml, "a: 1\nb: *nope\n", "ws.yaml")
    assert "alias (*nope)" in one_line_error(err, source="ws.yaml") and err.line == 2


@pytest.mark.parametrize("text", [
    "a: " + "[" * 20000 + "]" * 20000 + "\n",
    "a: " + "{b: " * 20000 + "1" + "}" * 20000 + "\n",
    "- " * 20000 + "x\n",  # block sequences nested on one line
    "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "x: 1\n",  # by indentation
])
def test_yaml_20k_levels_of_nesting_is_refused_fast(text):
    assert len(text) < 1 << 20
    err, seconds = timed(parse_yaml, text, "deep.yaml")
    msg = one_line_error(err, source="deep.yaml")
    assert seconds < FAST_S and "nested deeper than 64 levels" in msg


def test_yaml_nesting_bound_is_exact():
    """64 levels parse (each [ is a level), 65 do not."""
    assert parse_yaml("[" * 64 + "]" * 64, "x") == json.loads("[" * 64 + "]" * 64)
    err, _ = timed(parse_yaml, "[" * 65 + "]" * 65, "x")
    assert isinstance(err, ParseError)


def test_yaml_non_utf8_names_file_line_and_byte(tmp_path):
    p = tmp_path / "vecmerge.yaml"
    p.write_bytes(b"adapters:\n  v54: runs/v\xff54\n")
    err, _ = timed(load_yaml, p)
    msg = one_line_error(err, source=str(p))
    assert err.line == 2 and "0xff" in msg and "UTF-8" in msg


def test_yaml_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_bytes("\ufeffa: 1\n".encode())
    assert load_yaml(p) == {"a": 1}


def test_yaml_oversized_file_is_refused_without_parsing(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("a: " + "x" * (2 << 20) + "\n")
    err, seconds = timed(load_yaml, p)
    assert "larger than 1048576 bytes" in one_line_error(err, source=str(p)) and seconds < FAST_S
    err, seconds = timed(parse_yaml, p.read_text(), "big.yaml")
    assert "longer than 1048576 characters" in one_line_error(err, source="big.yaml") and seconds < FAST_S


def test_yaml_duplicate_key_names_both_lines():
    err, _ = timed(parse_yaml, "out: a\nrank: 4\nout: b\n", "r.yaml")
    msg = one_line_error(err, source="r.yaml")
    assert err.line == 3 and "'out' given twice (first on line 1)" in msg


def test_yaml_merge_key_without_alias_still_works():
    assert parse_yaml("a:\n  <<: {x: 1, y: 2}\n  y: 3\n", "r") == {"a": {"x": 1, "y": 3}}


def test_yaml_long_bad_value_is_not_echoed_whole():
    huge = "k" * 50000
    err, _ = timed(parse_yaml, f"? {huge}\n: 1\n? {huge}\n: 2\n", "r.yaml")  # explicit keys may be long
    msg = one_line_error(err, source="r.yaml")
    assert "50000 chars" in msg


@pytest.mark.parametrize("text, line, needle", [
    ("a: [1, 2\nb: 3\n", 2, "not valid YAML"),
    ("a: !!python/object:os.system ls\n", 1, "not valid YAML"),
    ("a: 1\nb: \x00\n", 2, "control character 0x00"),
    ("a: 1\n---\nb: 2\n", 2, "not valid YAML"),
])
def test_yaml_malformed_gives_file_line(text, line, needle):
    err, _ = timed(parse_yaml, text, "r.yaml")
    msg = one_line_error(err, source="r.yaml")
    assert err.line == line and needle in msg


def test_yaml_ordinary_recipe_matches_pyyaml():
    text = ("base: v54\ndirection: v51 - v28\ntrust: 0.0113\ndoses: [0.5, 1, 2]\n"
            "inputs:\n  v54: {sha256: \"" + "a" * 64 + "\"}\nflags: {strict: true, note: null}\n")
    assert parse_yaml(text, "r.yaml") == yaml.safe_load(text)


# ----------------------------------------------------------------------------------------------- JSON
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_json_non_finite_constants_are_refused(tmp_path, value):
    p = tmp_path / "adapter_config.json"
    p.write_text('{"r": 8, "lora_alpha": ' + value + "}")
    err, _ = timed(load_json, p)
    assert f"{value} is not a JSON number" in one_line_error(err, source=str(p))


def test_json_number_overflowing_to_infinity_is_refused():
    """float('1e999') is inf in Python; json.loads would accept it silently."""
    assert json.loads('{"lora_alpha": 1e999}')["lora_alpha"] == float("inf")
    err, _ = timed(parse_json, '{"lora_alpha": 1e999}', "c.json")
    assert "overflows to infinity" in one_line_error(err, source="c.json")


def test_json_5000_digit_integer_is_refused_fast():
    err, seconds = timed(parse_json, '{"r": ' + "7" * 5000 + "}", "c.json")
    msg = one_line_error(err, source="c.json")
    assert "an integer of 5000 digits" in msg and seconds < FAST_S


def test_json_100k_levels_are_refused_fast():
    err, seconds = timed(parse_json, "[" * 100000 + "]" * 100000, "c.json")
    assert "nested too deeply" in one_line_error(err, source="c.json") and seconds < FAST_S
    err, _ = timed(parse_json, '{"a": ' * 65 + "1" + "}" * 65, "c.json")  # readable, but past the bound
    assert "nested deeper than 64 levels" in one_line_error(err, source="c.json")


def test_json_non_utf8_and_syntax_errors_name_the_file_and_line(tmp_path):
    p = tmp_path / "adapter_config.json"
    p.write_bytes(b'{\n  "r": 8,\n  "x": "\xc3\x28"\n}')
    err, _ = timed(load_json, p)
    assert err.line == 3 and "0xc3" in one_line_error(err, source=str(p))
    p.write_text('{\n  "r": 8,\n  "lora_alpha": 16,\n}')
    err, _ = timed(load_json, p)
    assert err.line == 4 and "not valid JSON" in one_line_error(err, source=str(p))


def test_json_duplicate_key_is_refused():
    err, _ = timed(parse_json, '{"r": 8, "r": 64}', "c.json")
    assert "'r' given twice" in one_line_error(err, source="c.json")


def test_json_ordinary_config_matches_json_module(tmp_path):
    cfg = {"peft_type": "LORA", "r": 8, "lora_alpha": 16.0, "rank_pattern": {r"layers\.1\..*proj": 4},
           "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": None, "use_rslora": False}
    p = tmp_path / "adapter_config.json"
    p.write_text(json.dumps(cfg, indent=2))
    assert load_json(p) == json.loads(p.read_text()) == cfg


def test_json_missing_folder_and_oversized(tmp_path):
    err, _ = timed(load_json, tmp_path / "nope.json")
    assert "no such file" in one_line_error(err, source="nope.json")
    err, _ = timed(load_json, tmp_path)
    assert "is a folder" in one_line_error(err, source=str(tmp_path))
    (tmp_path / "big.json").write_text("[" + "1," * 1000 + "1]")
    err, _ = timed(load_json, tmp_path / "big.json", max_bytes=100)
    assert "larger than 100 bytes" in one_line_error(err, source="big.json")


# ---------------------------------------------------------------------------------------------- paths
@pytest.mark.parametrize("value, needle", [
    ("runs/v5\x004", "control character 0x00"),
    ("runs/v54\n---\nx: 1", "control character 0x0a"),
    ("", "expected a path"),
    (5, "expected a path"),
    (["a"], "expected a path"),
    ("a" * 5000, "a path of 5000 characters"),
])
def test_safe_path_refuses(value, needle):
    err, _ = timed(safe_path, value, field="adapters.v54", source="vecmerge.yaml")
    msg = one_line_error(err, source="vecmerge.yaml")
    assert needle in msg and "adapters.v54" in msg


def test_safe_path_accepts_ordinary_paths():
    assert str(safe_path("runs/v54/checkpoint-3", field="f", source="s")) == "runs/v54/checkpoint-3"
    assert str(safe_path("../données/v 54", field="f", source="s")) == "../données/v 54"


def test_short_truncates():
    assert short("x" * 10) == repr("x" * 10)
    s = short("x" * 1000)
    assert len(s) < 120 and s.endswith("(1000 chars)")
    assert len(short(list(range(10000)))) < 140


# ------------------------------------------------------------------------------------------- patterns
ORDINARY = ["q_proj", r"layers\.1\..*proj", r"^model\.layers\.0\.mlp\.up_proj", "q_proj|v_proj",
            r"model\.layers\.(\d+)\.(self_attn|mlp)\..*", r".*\.(q|k|v)_proj", r"layers\.[0-3]\.self_attn\.o_proj",
            "lm_head", r"(?:down|up)_proj"]
NAMES = ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj", "model.layers.0.mlp.up_proj",
         "base_model.model.model.layers.1.mlp.down_proj", "model.layers.3.self_attn.o_proj", "lm_head",
         "model.layers.12.self_attn.q_proj", "q_proj", "model.embed_tokens"]


def test_ordinary_keys_match_exactly_like_peft_and_fast():
    """The reference is PEFT's own rule evaluated with plain `re` (these keys are harmless)."""
    t = time.monotonic()
    for key in ORDINARY:
        check_pattern(key)
        for name in NAMES:
            assert pattern_matches(key, name) == bool(re.match(rf"(.*\.)?({key})$", name)), (key, name)
    assert time.monotonic() - t < 0.5


def test_pattern_set_takes_the_first_matching_key_in_order():
    keys = [r"layers\.1\..*", "q_proj", ".*"]
    ps = PatternSet(keys, field="alpha_pattern")
    expected = {n: next((k for k in keys if re.match(rf"(.*\.)?({k})$", n)), None) for n in NAMES}
    assert {n: ps.first_key(n) for n in NAMES} == expected
    assert PatternSet([]).first_key("q_proj") is None


def test_invalid_regex_names_the_key():
    err, _ = timed(check_pattern, "q_proj(", field="rank_pattern", source="v28/adapter_config.json")
    msg = one_line_error(err, source="v28/adapter_config.json", cls=PatternError)
    assert "rank_pattern key 'q_proj('" in msg and "not a valid regex" in msg


@pytest.mark.parametrize("key, needle", [
    ("(.*)*(.*)*(.*)*(.*)*(.*)*!", "a repeat inside a repeat"),
    ("(a+)+$", "a repeat inside a repeat"),
    ("(x{1,50}){1,50}!", "a repeat inside a repeat"),
    ("(a|aa)*!", "a repeated alternation"),
    (".*.*.*.*.*!", "5 variable repeats"),
    (r"\w+\d+\w+\d+\w+!", "5 variable repeats"),
])
def test_pathological_keys_are_refused_within_seconds(key, needle):
    """Unguarded, the first key ran for minutes on one module name (issue 11, item 8)."""
    name = "model.layers.0.self_attn.q_proj" * 3
    err, seconds = timed(pattern_matches, key, name, field="rank_pattern", source="adapter_config.json")
    msg = one_line_error(err, source="adapter_config.json", cls=PatternError)
    assert needle in msg and seconds < FAST_S


@pytest.mark.parametrize("key", [5, None, "x" * 1001])
def test_non_string_and_huge_keys_are_refused(key):
    err, _ = timed(check_pattern, key, field="alpha_pattern", source="c.json")
    assert "alpha_pattern key" in one_line_error(err, source="c.json", cls=PatternError)


SLOW_KEY = r"\w*\w*\w*\w*!"  # passes the static check (4 repeats), costs ~len**4 steps on a miss


def test_time_budget_stops_a_slow_key_that_passes_the_static_check():
    check_pattern(SLOW_KEY)
    name = "a" * 400  # about 3 s unguarded on this machine
    err, seconds = timed(PatternSet([SLOW_KEY], budget_s=0.2).first_key, name)
    msg = one_line_error(err, source="adapter_config.json", cls=PatternError)
    assert "took over 0.2 s" in msg and seconds < 1.0


def test_time_budget_restores_the_previous_alarm_handler():
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGALRM, mine)
    try:
        assert pattern_matches("q_proj", "a.q_proj")
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, old)


def test_time_budget_off_the_main_thread_uses_a_child_process():
    out = {}

    def work():
        out["ok"] = PatternSet(["x", "q_proj"]).first_key("model.q_proj")
        out["slow"] = timed(PatternSet([SLOW_KEY], budget_s=0.2).first_key, "a" * 400)

    th = threading.Thread(target=work)
    th.start()
    th.join(10)
    assert out["ok"] == "q_proj"
    err, seconds = out["slow"]
    assert isinstance(err, PatternError) and SLOW_KEY.replace("\\", "\\\\") in str(err) and seconds < 2.0


@pytest.mark.parametrize("key, refused", [
    ("a{100}.*.*.*.*!", False),          # {100} is a fixed count (MAX_COUNT): 4 variable repeats pass
    ("a{101}.*.*.*.*!", True),           # {101} counts as unbounded: 5
    ("a{150}.*.*.*.*!", True),
    ("a{1,2}.*.*.*.*!", True),           # any {m,n} with m != n is variable
    ("a{2}.*.*.*.*!", False),
    (".*.*(?:.*){3}!", True),            # {3} of one repeat is 3: 2 + 3
    (".*.*.*(?:.*){1}!", False),         # {1} of one repeat is 1: 3 + 1
    (".*.*.*(.*.*)!", True),             # a group adds its repeats: 3 + 2
    (".*.*.*(?:a.*.*|b)!", True),        # an alternation adds its costliest branch: 3 + 2
    (".*.*.*(?:a.*|b.*)!", False),       # 3 + 1
])
def test_variable_repeats_are_counted_as_documented(key, refused):
    """MAX_REPEATS = 4 variable repeats in a row pass, 5 are refused; the count follows the module docstring."""
    err, _ = timed(check_pattern, key, field="rank_pattern", source="c.json")
    if refused:
        assert "variable repeats" in one_line_error(err, source="c.json", cls=PatternError)
    else:
        assert err is None


@pytest.mark.skipif(not hasattr(re, "NOFLAG"), reason="atomic groups need Python 3.11")
def test_an_atomic_group_counts_its_repeats():
    err, _ = timed(check_pattern, ".*.*.*(?>.*.*)!", source="c.json")
    assert "5 variable repeats" in one_line_error(err, source="c.json", cls=PatternError)


def test_refusals_say_what_and_why_in_full():
    """The messages name the field (rank_pattern by default), the file (adapter_config.json by default), the key,
    the shape found and the fix, word for word."""
    cases = {
        "(a+)+$": "rank_pattern key '(a+)+$': a repeat inside a repeat (such as (a+)+ or (.*)*) can take minutes "
                  "to match a module name; write the pattern without it (plain module names are enough)",
        "(?:(?:ab|cd){2})*!": "rank_pattern key '(?:(?:ab|cd){2})*!': a repeated alternation (such as (a|aa)*) can "
                              "take minutes to match a module name; write the pattern without it (plain module "
                              "names are enough)",
        "q_proj(": "rank_pattern key 'q_proj(': not a valid regex (missing ), unterminated subpattern); escape "
                   r"special characters such as '(' as '\(' or fix the pattern",
    }
    for key, problem in cases.items():
        for err, _ in (timed(check_pattern, key), timed(pattern_matches, key, "model.q_proj")):
            assert str(one_line_error(err, source="adapter_config.json", cls=PatternError)) == \
                f"adapter_config.json: {problem}"
    err, _ = timed(pattern_matches, "(a+)+$", "x", field="alpha_pattern", source="c.json")
    assert str(err).startswith("c.json: alpha_pattern key '(a+)+$': a repeat inside a repeat")


def test_key_length_bound_is_exact():
    assert check_pattern("a" * 1000) is None
    err, _ = timed(check_pattern, "a" * 1001, source="c.json")
    assert "longer than 1000 characters" in one_line_error(err, source="c.json", cls=PatternError)


def test_a_key_valid_only_inside_peft_regex_is_accepted_like_peft():
    """``q_proj)|(k_proj`` is no regex alone, but PEFT uses ``(.*\\.)?(KEY)$``, where it is one: checked as PEFT
    uses it, and matched as PEFT matches it (plain ``re`` on the wrapped key)."""
    key = "q_proj)|(k_proj"
    check_pattern(key)
    for name in NAMES + ["model.layers.0.self_attn.k_proj", "k_proj_extra"]:
        assert pattern_matches(key, name) == bool(re.match(rf"(.*\.)?({key})$", name)), name


def test_target_module_regexes_get_no_allowance_for_a_prefix():
    """target_modules is matched as written (no PEFT prefix): its own 5 variable repeats are refused."""
    from vecmerge.peft.format import targeted

    with pytest.raises(PatternError, match="5 variable repeats"):
        targeted({"target_modules": r".*.*.*.*.*q_proj"}, "model.layers.0.self_attn.q_proj")
    assert targeted({"target_modules": r".*.*.*.*q_proj"}, "model.layers.0.self_attn.q_proj")


def test_time_budget_off_the_main_thread_keeps_its_bounds():
    """In the child: a fast key matches even under a 0.2 s budget, the slow one is stopped within budget + 0.5 s
    (the kill) plus a margin (1.4 s in all), and the message names the key that ran out of time (the second)."""
    out = {}

    def work():
        out["fast"] = PatternSet(["x", "q_proj"], budget_s=0.2).first_key("model.q_proj")
        out["slow"] = timed(PatternSet(["q_proj", SLOW_KEY], budget_s=0.2, source="s.json").first_key, "a" * 400)

    th = threading.Thread(target=work)
    th.start()
    th.join(10)
    assert out["fast"] == "q_proj"
    err, seconds = out["slow"]
    msg = one_line_error(err, source="s.json", cls=PatternError)
    assert msg.startswith(f"s.json: rank_pattern key {SLOW_KEY!r}: matching module") and seconds < 1.4


@pytest.mark.parametrize("stdout, named", [(b"0\n1\n", "k1"), ("0\n1\n", "k1"), (b"", "k0"), (None, "k0")])
def test_a_child_killed_at_the_budget_names_the_key_it_was_on(monkeypatch, stdout, named):
    """The child prints each key's index before matching it; whatever it printed before the kill (bytes on POSIX,
    text elsewhere, or nothing) names the key in the message, the first when nothing was printed."""
    import subprocess

    from vecmerge.io import patterns as safe_pattern

    def killed(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs.get("timeout"), output=stdout)

    monkeypatch.setattr(safe_pattern.subprocess, "run", killed)
    monkeypatch.setattr(safe_pattern, "_alarm", lambda s: _no_timer())
    err, _ = timed(PatternSet(["k0", "k1"], source="c.json").first_key, "model.q_proj")
    assert one_line_error(err, source="c.json", cls=PatternError).startswith(f"c.json: rank_pattern key '{named}'")


@contextlib.contextmanager
def _no_timer():
    yield False
