"""Scores and divergences against a hand computation in numpy (plain loops over items, positions and tokens)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vecmerge.probe import scores
from vecmerge.probe.scores import divergences, item_scores

LENGTHS = [3, 1, 4]


def logsoftmax(row):
    m = max(row)
    z = math.log(sum(math.exp(v - m) for v in row)) + m
    return [v - z for v in row]


def hand_kl(a_rows, b_rows):
    total = 0.0
    for la, lb in zip(a_rows, b_rows):
        pa, qa, qb = [math.exp(v) for v in logsoftmax(la)], logsoftmax(la), logsoftmax(lb)
        total += sum(p * (x - y) for p, x, y in zip(pa, qa, qb))
    return total / len(a_rows)


def hand_js(a_rows, b_rows):
    total = 0.0
    for la, lb in zip(a_rows, b_rows):
        pa, pb = [math.exp(v) for v in logsoftmax(la)], [math.exp(v) for v in logsoftmax(lb)]
        m = [(x + y) / 2 for x, y in zip(pa, pb)]
        total += 0.5 * sum(p * math.log(p / q) for p, q in zip(pa, m) if p > 0) + \
            0.5 * sum(p * math.log(p / q) for p, q in zip(pb, m) if p > 0)
    return total / len(a_rows)


def split(rows, lengths):
    out, at = [], 0
    for t in lengths:
        out.append(rows[at:at + t])
        at += t
    return out


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(3)
    n, vocab = sum(LENGTHS), 11
    a = torch.randn(n, vocab, generator=g) * 2
    b = a + 0.7 * torch.randn(n, vocab, generator=g)
    targets = torch.randint(0, vocab, (n,), generator=g)
    return a, b, targets


def test_item_scores_by_hand(batch):
    a, _, targets = batch
    a[4:8] = 0.0
    a[torch.arange(4, 8), targets[4:8]] = 5.0  # item 2: every target token the argmax, so greedy reproduces it
    got = item_scores(a, targets, LENGTHS)
    rows, tgt = split(a.tolist(), LENGTHS), split(targets.tolist(), LENGTHS)
    for i in range(len(LENGTHS)):
        loglik = sum(logsoftmax(r)[y] for r, y in zip(rows[i], tgt[i]))
        exact = int(all(max(range(len(r)), key=lambda v, r=r: (r[v], -v)) == y for r, y in zip(rows[i], tgt[i])))
        rank = 1 + sum(v > rows[i][0][tgt[i][0]] for v in rows[i][0])
        assert got["loglik"][i] == pytest.approx(loglik, rel=1e-12)
        assert (got["exact"][i], got["first_rank"][i], got["tokens"][i]) == (exact, rank, LENGTHS[i])
    assert got["exact"][2] == 1 and got["first_rank"][2] == 1


def test_a_tie_at_the_top_goes_to_the_lowest_id_as_greedy_decoding_does():
    logits = torch.zeros(1, 5)
    logits[0, 1] = logits[0, 3] = 2.0
    assert item_scores(logits, torch.tensor([1]), [1])["exact"] == [1]
    assert item_scores(logits, torch.tensor([3]), [1]) == {"loglik": [pytest.approx(math.log(math.exp(2) / (
        2 * math.exp(2) + 3)), rel=1e-12)], "tokens": [1], "exact": [0], "first_rank": [1]}


@pytest.mark.parametrize("chunk", [scores.ROW_CHUNK_BYTES, 1])
def test_divergences_by_hand(batch, monkeypatch, chunk):
    monkeypatch.setattr(scores, "ROW_CHUNK_BYTES", chunk)  # 1 byte: one row at a time
    a, b, _ = batch
    c = -a
    got = divergences({"a": a, "b": b, "c": c}, [("a", "b"), ("b", "c")], LENGTHS)
    for (x, y), (lx, ly) in {("a", "b"): (a, b), ("b", "c"): (b, c)}.items():
        for i, (ra, rb) in enumerate(zip(split(lx.tolist(), LENGTHS), split(ly.tolist(), LENGTHS))):
            assert got[(x, y)]["kl_ab"][i] == pytest.approx(hand_kl(ra, rb), rel=1e-10)
            assert got[(x, y)]["kl_ba"][i] == pytest.approx(hand_kl(rb, ra), rel=1e-10)
            assert got[(x, y)]["js"][i] == pytest.approx(hand_js(ra, rb), rel=1e-10)
            assert 0 <= got[(x, y)]["js"][i] <= math.log(2)
    same = divergences({"a": a, "b": a.clone()}, [("a", "b")], LENGTHS)[("a", "b")]
    assert max(same["kl_ab"]) < 1e-14 and same["js"] == [0.0] * 3  # JS: H(m) - H(p) with m == p exactly


def test_a_token_one_model_rules_out_adds_nothing():
    a = torch.tensor([[0.0, 0.0, -math.inf]])
    b = torch.tensor([[0.0, 1.0, 2.0]])
    d = divergences({"a": a, "b": b}, [("a", "b")], [1])[("a", "b")]
    qb = logsoftmax([0.0, 1.0, 2.0])
    assert d["kl_ab"][0] == pytest.approx(0.5 * (math.log(0.5) - qb[0]) + 0.5 * (math.log(0.5) - qb[1]), rel=1e-12)
    assert d["kl_ba"][0] == math.inf and np.isfinite(d["js"][0])
