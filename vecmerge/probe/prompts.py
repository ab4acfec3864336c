"""A probe's prompt file: JSON Lines of items, each a prompt and the target the model should continue it with.

    {"id": "q1", "prompt": "The capital of France is", "target": " Paris", "task": "geo", "cluster": "europe"}
    {"id": 2, "prompt_ids": [12, 7, 99], "target_ids": [5, 6]}

``id`` is unique; each item has ``prompt`` or ``prompt_ids`` and ``target`` or ``target_ids`` (one of each, at
least one token each); ``task`` and ``cluster`` are optional. Text is encoded with the base folder's tokenizer
as lm-evaluation-harness encodes a (context, continuation) pair: ``target_ids = encode(prompt +
target)[len(prompt_ids):]``. The file is read once, bounded (``io.parse``), and hashed as read; every problem
is reported at once, each naming its line. The rules in full: docs/design/probe.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import few
from ..io.files import check_folder
from ..io.parse import ParseError, decode_utf8, parse_jsonl, read_bytes, short

MAX_BYTES = 64 << 20
MAX_ITEMS = 100_000
MAX_TOKENS = 16_384  # prompt + target tokens of one item
KEYS = ("id", "prompt", "prompt_ids", "target", "target_ids", "task", "cluster")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class Item:
    """One prompt and its target, as token ids.

    Args:
        id (str): unique in the file. prompt_ids (tuple[int, ...]): P >= 1 tokens. target_ids (tuple[int, ...]): T >= 1.
        task (str | None): its sub-score. cluster (str | None): its cluster key. line (int): where it was read.
    """

    id: str
    prompt_ids: tuple
    target_ids: tuple
    task: str | None = None
    cluster: str | None = None
    line: int = 0

    @property
    def length(self) -> int:
        """P + T: the tokens the model reads."""
        return len(self.prompt_ids) + len(self.target_ids)


@dataclass(frozen=True)
class PromptSet:
    """A prompt file read and tokenized.

    Args:
        path (Path): the file. sha256 (str): of its bytes. items (tuple[Item, ...]): in file order.
        stem (str): the name its metrics carry (``probe:<stem>:loglik``). tokenized (bool): some text was encoded.
    """

    path: Path
    sha256: str
    items: tuple
    stem: str
    tokenized: bool = False

    @property
    def ids(self) -> list[str]:
        return [it.id for it in self.items]

    def by_id(self) -> dict[str, Item]:
        return {it.id: it for it in self.items}

    def check_vocab(self, vocab: int, model: str) -> None:
        """ParseError naming each line whose token ids are not below ``vocab`` (the model's vocabulary size)."""
        bad = [f"line {it.line} ({it.id}): token {max(it.prompt_ids + it.target_ids)}"
               for it in self.items if max(it.prompt_ids + it.target_ids) >= vocab]
        if bad:
            raise ParseError(self.path, f"{len(bad)} item(s) hold token ids outside {model}'s vocabulary of {vocab} "
                                        f"({few(bad, 3)}); use ids below {vocab}")

    def check_context(self, context: int | None, model: str) -> None:
        """ParseError naming each item longer (prompt + target tokens) than ``context``, the model's positions
        (None: no limit). Such an item would be scored past the positions the model was built for (Llama) or
        fail inside it (GPT-2's position table)."""
        if context is None:
            return
        bad = [f"line {it.line} (id {it.id}): {it.length} tokens" for it in self.items if it.length > context]
        if bad:
            raise ParseError(self.path, f"{len(bad)} item(s) longer than {model}'s context of {context} positions "
                                        f"({few(bad, 3)}); shorten them to at most {context} prompt + target tokens")


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def model_context(config) -> int | None:
    """The most positions a model reads: the first of ``CONTEXT_KEYS`` its config (or its ``text_config``) holds
    as a positive integer; None when it holds none (a model without a position limit)."""
    for cfg in (config, getattr(config, "text_config", None)):
        for key in CONTEXT_KEYS:
            value = getattr(cfg, key, None) if cfg is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def find_tokenizer(folder) -> Path | None:
    """``folder`` when it holds tokenizer files (``TOKENIZER_FILES``), else None."""
    folder = Path(folder)
    check_folder(folder)  # transformers opens the files it picks: a FIFO among them would hang it
    return folder if any((folder / f).is_file() for f in TOKENIZER_FILES) else None


def load_tokenizer(folder):
    """The base folder's tokenizer (``transformers.AutoTokenizer``), or a ParseError saying why it cannot load."""
    from transformers import AutoTokenizer

    from .quiet import quiet_libraries

    check_folder(folder)
    try:
        with quiet_libraries():
            return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # anything transformers raises is the finding
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ParseError(folder, f"its tokenizer does not load ({type(e).__name__}: {short(msg, 120)[1:-1]}); "
                                 "save a working tokenizer there, or give prompt_ids and target_ids") from None


_NO_TOKENIZER = "text without a tokenizer"  # one marker per line with text; read_prompts writes them as one problem


def _no_tokenizer(problems: list, lines: list[int]) -> list:
    """``problems`` with the markers of text without a tokenizer replaced by one problem naming the lines."""
    if not lines:
        return problems
    one = (f"line {lines[0]}: text (prompt or target), and the base model folder has no tokenizer "
           f"({', '.join(TOKENIZER_FILES)}); save its tokenizer there or give prompt_ids and target_ids"
           + (f" ({len(lines)} lines hold text: {few(lines, 5)})" if len(lines) > 1 else ""))
    return [one] + [p for p in problems if p != _NO_TOKENIZER]


def _ids(value, line: int, key: str, problems: list) -> tuple | None:
    if not isinstance(value, list) or not value or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        problems.append(f"line {line}: {key}: {short(value, 40)} must be a non-empty list of token ids (integers >= 0)")
        return None
    return tuple(value)


def _name(value, line: int, key: str, problems: list) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and key == "id":
        value = str(value)
    if not isinstance(value, str) or not value.strip() or value != value.strip() or "\n" in value:
        problems.append(f"line {line}: {key}: {short(value, 40)} must be a non-empty string without edge spaces"
                        + (" or an integer" if key == "id" else ""))
        return None
    return value


def _encode_pair(tokenizer, prompt: str, target: str) -> tuple[list, list, bool]:
    """lm-evaluation-harness's rule for a (context, continuation) pair (module docstring), and whether
    ``encode(prompt)`` is a prefix of ``encode(prompt + target)`` (False: the two merge at the boundary, so the
    continuation's ids would not be the target's)."""
    spaces = len(prompt) - len(prompt.rstrip())
    if spaces:
        prompt, target = prompt[:-spaces], prompt[-spaces:] + target
    ctx = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    whole = tokenizer(prompt + target, add_special_tokens=False)["input_ids"]
    return list(ctx), list(whole[len(ctx):]), list(whole[:len(ctx)]) == list(ctx)


def _item(number: int, raw, tokenizer, problems: list) -> Item | None:
    """One line as an Item (token ids), or None after noting its problems."""
    if not isinstance(raw, dict):
        problems.append(f"line {number}: expected a JSON object with id, prompt or prompt_ids, target or target_ids")
        return None
    start = len(problems)
    unknown = sorted(k for k in raw if k not in KEYS)
    if unknown:
        problems.append(f"line {number}: unknown key(s) {few(short(k, 30) for k in unknown)}; expected "
                        f"{', '.join(KEYS)}")
    if "id" not in raw:
        problems.append(f"line {number}: no id")
    ident = _name(raw.get("id"), number, "id", problems)
    task, cluster = (_name(raw.get(k), number, k, problems) for k in ("task", "cluster"))
    parts = {}
    for side in ("prompt", "target"):
        given = [k for k in (side, f"{side}_ids") if k in raw]
        if len(given) != 1:
            problems.append(f"line {number}: give {side} (text) or {side}_ids (token ids)" +
                            (", not both" if given else ""))
        elif given[0] == side and not (isinstance(raw[side], str) and raw[side]):
            problems.append(f"line {number}: {side}: {short(raw[side], 40)} must be non-empty text")
        elif given[0] == side and tokenizer is None:
            problems.append(_NO_TOKENIZER)
        elif given[0] == side:
            parts[side] = raw[side]
        else:
            parts[side] = _ids(raw[given[0]], number, given[0], problems)
    if len(problems) > start:
        return None
    prompt, target = parts["prompt"], parts["target"]
    if isinstance(prompt, str) and isinstance(target, str):
        text = parts["prompt"][-12:] + "|" + parts["target"][:12]
        prompt, target, aligned = _encode_pair(tokenizer, prompt, target)
        if not aligned:
            problems.append(f"line {number}: the prompt's end and the target's start merge into one token when "
                            f"encoded together ({short(text, 40)}), so the scored tokens would not be the target; "
                            "start the target with a space, or give prompt_ids and target_ids")
            return None
    else:
        prompt = tokenizer(prompt, add_special_tokens=False)["input_ids"] if isinstance(prompt, str) else prompt
        target = tokenizer(target, add_special_tokens=False)["input_ids"] if isinstance(target, str) else target
    for side, ids in (("prompt", prompt), ("target", target)):
        if not ids:
            problems.append(f"line {number}: the {side} encodes to no tokens; give a longer {side}")
    unk = getattr(tokenizer, "unk_token_id", None) if isinstance(parts["target"], str) else None
    if unk is not None and unk in target:
        problems.append(f"line {number}: the target holds the tokenizer's unknown token ({tokenizer.unk_token}), so "
                        "its log-likelihood would score that token, not the target's words; use words the tokenizer "
                        "knows, or give target_ids")
    if prompt and target and len(prompt) + len(target) > MAX_TOKENS:
        problems.append(f"line {number}: {len(prompt) + len(target)} tokens, more than {MAX_TOKENS}; shorten it")
    if len(problems) > start:
        return None
    return Item(str(ident), tuple(prompt), tuple(target), task, cluster, number)


def read_prompts(path, tokenizer_folder=None, *, stem: str | None = None, max_items: int = MAX_ITEMS) -> PromptSet:
    """Read, check and tokenize a prompt file (format: module docstring); every problem reported at once.

    Args:
        path (str | Path): the JSON Lines file. tokenizer_folder (str | Path | None): the base model folder, whose
            tokenizer encodes text (loaded only when an item has text). stem (str | None): the name of its metrics
            (default: the file name without ``.jsonl``). max_items (int): the most items accepted.

    Returns:
        PromptSet: the items, the file's sha256 and the stem.
    """
    path = Path(path)
    data = read_bytes(path, max_bytes=MAX_BYTES)
    sha = hashlib.sha256(data).hexdigest()
    rows = parse_jsonl(decode_utf8(data, path), path, max_lines=max_items, max_depth=4)
    if not rows:
        raise ParseError(path, "holds no items; write one JSON object per line (id, prompt_ids, target_ids)")
    needs_text = any(isinstance(r, dict) and ("prompt" in r or "target" in r) for _, r in rows)
    folder = find_tokenizer(tokenizer_folder) if tokenizer_folder is not None and needs_text else None
    tokenizer = load_tokenizer(folder) if folder is not None else None
    problems: list[str] = []
    items, textual = [], []
    for number, raw in rows:
        start = len(problems)
        it = _item(number, raw, tokenizer, problems)
        if it is not None:
            items.append(it)
        if _NO_TOKENIZER in problems[start:]:
            textual.append(number)
    problems = _no_tokenizer(problems, textual)
    seen: dict[str, int] = {}
    for it in items:
        if it.id in seen:
            problems.append(f"line {it.line}: id {it.id!r} already given on line {seen[it.id]}; ids must be unique")
        seen.setdefault(it.id, it.line)
    if problems:
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems: {few(problems, 10, '; ')}"
        raise ParseError(path, head + "; fix the prompt file")
    name = stem if stem is not None else (path.name[:-6] if path.name.endswith(".jsonl") else path.stem)
    if not name or any(c in name for c in ": \n\t"):
        raise ParseError(path, f"the metric name {short(name, 40)} is empty or holds ':' or spaces; pass --name NAME")
    return PromptSet(path, sha, tuple(items), name, tokenizer is not None)
