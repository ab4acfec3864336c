"""Prompt files: the format, every problem at once with its line, the bounds, the hash, and text through a tokenizer
built here with the ``tokenizers`` library (its word ids are known, so the expected ids are written by hand)."""

from __future__ import annotations

import hashlib
import json

import pytest

from vecmerge.io.parse import ParseError
from vecmerge.probe.prompts import find_tokenizer, read_prompts

WORDS = ["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"]  # id = position


def jsonl(path, *rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_ids_are_read_with_their_task_cluster_and_the_file_hash(tmp_path):
    f = jsonl(tmp_path / "set.v1.jsonl", {"id": 7, "prompt_ids": [1, 2], "target_ids": [3], "task": "t"},
              "", {"id": "b", "prompt_ids": [4], "target_ids": [5, 6], "cluster": "k"})
    ps = read_prompts(f)
    assert ps.ids == ["7", "b"] and ps.stem == "set.v1" and not ps.tokenized
    assert ps.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    a, b = ps.items
    assert (a.prompt_ids, a.target_ids, a.task, a.cluster, a.line) == ((1, 2), (3,), "t", None, 1)
    assert (b.length, b.cluster, b.line) == (3, "k", 3)


def test_a_stem_is_a_metric_name(tmp_path):
    f = jsonl(tmp_path / "probe set.jsonl", {"id": 1, "prompt_ids": [1], "target_ids": [2]})
    with pytest.raises(ParseError, match="pass --name NAME"):
        read_prompts(f)
    assert read_prompts(f, stem="set1").stem == "set1"
    assert read_prompts(jsonl(tmp_path / "heldout.jsonl", {"id": 1, "prompt_ids": [1], "target_ids": [2]})).stem == \
        "heldout"


def test_every_problem_is_reported_at_once_with_its_line(tmp_path):
    f = jsonl(tmp_path / "bad.jsonl",
              {"id": "a", "prompt_ids": [1], "target_ids": [2]},
              {"id": "a", "prompt_ids": [1], "target_ids": [2]},
              {"prompt_ids": [1], "prompt": "x", "target_ids": []},
              {"id": True, "prompt_ids": [-1], "target_ids": [1.5], "extra": 1},
              ["not", "an", "object"])
    with pytest.raises(ParseError) as err:
        read_prompts(f)
    msg = str(err.value)
    assert msg.startswith(f"{f}: ") and "fix the prompt file" in msg and "\n" not in msg
    for part in ("line 3: no id", "line 3: give prompt (text) or prompt_ids (token ids), not both",
                 "line 3: target_ids: [] must be a non-empty list", "line 4: unknown key(s) 'extra'",
                 "line 4: id: True must be", "line 4: prompt_ids: [-1]", "line 5: expected a JSON object",
                 "line 2: id 'a' already given on line 1"):
        assert part in msg, part
    assert ": 9 problems: line 3: no id;" in msg


def test_text_without_a_tokenizer_is_refused_naming_the_line(tmp_path):
    f = jsonl(tmp_path / "text.jsonl", {"id": 1, "prompt_ids": [1], "target_ids": [2]},
              {"id": 2, "prompt": "the cat", "target_ids": [2]})
    with pytest.raises(ParseError, match=r"line 2: text \(prompt or target\), and the base model folder has no "
                                         r"tokenizer \(tokenizer.json.*\); save its tokenizer there or give"):
        read_prompts(f, tmp_path)
    with pytest.raises(ParseError, match="no tokenizer"):
        read_prompts(f)  # no folder at all


def test_many_text_lines_without_a_tokenizer_give_one_short_line(tmp_path):
    """Issue 36 item 11: 2000 text items and no tokenizer were one error line of thousands of characters."""
    rows = [{"id": i, "prompt": "the cat", "target": " sat"} for i in range(2000)]
    f = jsonl(tmp_path / "text.jsonl", *rows, {"id": "x", "prompt_ids": [1]})
    with pytest.raises(ParseError) as err:
        read_prompts(f, tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 500, len(msg)
    assert "line 1: text (prompt or target)" in msg and "2000 lines hold text: 1, 2, 3, 4, 5 and 1995 more" in msg
    assert "line 2001: give target (text) or target_ids" in msg  # the file's other problems are still named


def test_a_broken_tokenizer_model_is_one_line_without_library_warnings(tmp_path, capfd):
    """Issue 36 item 11: a corrupt ``tokenizer.model`` let transformers' warnings through; now only the error."""
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(bytes(range(256)) * 2)
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    f = jsonl(tmp_path / "t.jsonl", {"id": 1, "prompt": "the cat", "target": " sat"})
    capfd.readouterr()
    with pytest.raises(ParseError, match="its tokenizer does not load") as err:
        read_prompts(f, folder)
    out, errs = capfd.readouterr()
    assert out == "" and errs == "", (out, errs)
    assert "\n" not in str(err.value)


def test_bounds_and_bad_json_name_the_line(tmp_path):
    f = jsonl(tmp_path / "j.jsonl", {"id": 1, "prompt_ids": [1], "target_ids": [2]}, '{"id": 2, "prompt_ids": [1,')
    with pytest.raises(ParseError, match=r"j.jsonl:2: not valid JSON"):
        read_prompts(f)
    f = jsonl(tmp_path / "many.jsonl", *({"id": i, "prompt_ids": [1], "target_ids": [2]} for i in range(4)))
    with pytest.raises(ParseError, match=r"many.jsonl:4: more than 3 lines"):
        read_prompts(f, max_items=3)
    with pytest.raises(ParseError, match="holds no items"):
        read_prompts(jsonl(tmp_path / "empty.jsonl", ""))
    f = jsonl(tmp_path / "deep.jsonl", {"id": 1, "prompt_ids": [[[[[1]]]]], "target_ids": [2]})
    with pytest.raises(ParseError, match="nested deeper than 4 levels"):
        read_prompts(f)


def test_check_vocab_names_each_line(tmp_path):
    ps = read_prompts(jsonl(tmp_path / "v.jsonl", {"id": 1, "prompt_ids": [1], "target_ids": [9]},
                            {"id": 2, "prompt_ids": [1], "target_ids": [2]}))
    ps.check_vocab(10, "m")
    with pytest.raises(ParseError, match=r"1 item\(s\) hold token ids outside m's vocabulary of 9 \(line 1 \(1\): "
                                         r"token 9\)"):
        ps.check_vocab(9, "m")


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    """A word-level tokenizer built with ``tokenizers`` and saved as transformers saves one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def test_text_is_encoded_with_the_folders_tokenizer(tmp_path, tokenizer_folder):
    assert find_tokenizer(tokenizer_folder) == tokenizer_folder and find_tokenizer(tmp_path) is None
    f = jsonl(tmp_path / "t.jsonl", {"id": 1, "prompt": "the cat sat ", "target": "on a mat"},
              {"id": 2, "prompt": "a dog", "target_ids": [3]}, {"id": 3, "prompt_ids": [6], "target": "mat"})
    ps = read_prompts(f, tokenizer_folder)
    ids = {w: i for i, w in enumerate(WORDS)}
    assert ps.tokenized
    assert ps.items[0].prompt_ids == (ids["the"], ids["cat"], ids["sat"])
    assert ps.items[0].target_ids == (ids["on"], ids["a"], ids["mat"])
    assert ps.items[1].prompt_ids == (ids["a"], ids["dog"]) and ps.items[1].target_ids == (3,)
    assert ps.items[2].target_ids == (ids["mat"],)
    f = jsonl(tmp_path / "u.jsonl", {"id": 1, "prompt": "the zebra", "target": " sat"},  # an unknown prompt word: ok
              {"id": 2, "prompt_ids": [6], "target": "zebra"})  # an unknown target word: its loglik would be [UNK]'s
    with pytest.raises(ParseError, match=r"line 2: the target holds the tokenizer's unknown token \(\[UNK\]\), so its "
                                         r"log-likelihood would score that token"):
        read_prompts(f, tokenizer_folder)
    f = jsonl(tmp_path / "m.jsonl", {"id": 1, "prompt": "the cat", "target": "sat"})  # "catsat": one word
    with pytest.raises(ParseError, match=r"line 1: the prompt's end and the target's start merge into one token "
                                         r"when encoded together .*start the target with a space"):
        read_prompts(f, tokenizer_folder)
    f = jsonl(tmp_path / "e.jsonl", {"id": 1, "prompt": "the", "target": "   "})
    with pytest.raises(ParseError, match="line 1: the target encodes to no tokens"):
        read_prompts(f, tokenizer_folder)
