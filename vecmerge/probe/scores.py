"""Teacher-forced scores of one item, and divergences between two models' next-token distributions.

With ``l_t`` the float32 logits at the T target positions and ``log p_t = log_softmax(l_t)`` in float64:

    loglik      sum_t log p_t(y_t)                         (the target's log-likelihood, nats)
    exact       1 if argmax l_t = y_t for every t, else 0  (greedy decoding reproduces the target)
    first_rank  1 + #{v : l_1(v) > l_1(y_1)}
    kl_ab       (1/T) sum_t sum_v p_a,t(v) (log p_a,t(v) - log p_b,t(v))
    js          (1/T) sum_t [KL(p_a,t || m_t) + KL(p_b,t || m_t)] / 2,  m_t = (p_a,t + p_b,t) / 2   (<= log 2)

Every pair's cross term comes from one batched matrix product; ``JS = H(m) - (H(p_a) + H(p_b)) / 2``; rounding
below 0 is clipped; a token one model rules out is handled term by term (``inf`` where only the other allows
it). Float64 work runs over ``ROW_CHUNK_BYTES`` of rows at a time. The details: docs/design/probe.md.
"""

from __future__ import annotations

import torch

ROW_CHUNK_BYTES = 8 << 20  # small enough for the row chunk to stay in cache


def segments(lengths) -> torch.Tensor:
    """The item index of each row: ``[0]*T_0 + [1]*T_1 + ...`` (a long tensor)."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(list(lengths)))


def _per_item(row_values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.float64, device=row_values.device).index_add_(0, index, row_values)


def _chunks(rows: int, vocab: int, models: int):
    step = max(1, ROW_CHUNK_BYTES // max(1, 8 * vocab * models))
    return [(i, min(rows, i + step)) for i in range(0, rows, step)]


def item_scores(logits: torch.Tensor, targets: torch.Tensor, lengths) -> dict[str, list]:
    """``{"loglik", "tokens", "exact", "first_rank"}``, one value per item (module docstring formulas).

    Args:
        logits (Tensor): (N, V), N = sum of the items' T, the rows of item after item. targets (Tensor): (N,) ids.
        lengths (Sequence[int]): each item's T.
    """
    index = segments(lengths).to(logits.device)
    n, rows = len(lengths), logits.shape[0]
    loglik = torch.zeros(n, dtype=torch.float64, device=logits.device)
    for lo, hi in _chunks(rows, logits.shape[1], 1):
        lp = torch.log_softmax(logits[lo:hi].double(), dim=-1)
        loglik.index_add_(0, index[lo:hi], lp.gather(1, targets[lo:hi, None]).squeeze(1))
    hit = (logits.argmax(dim=-1) == targets).double()
    exact = _per_item(hit, index, n) == torch.as_tensor(list(lengths), dtype=torch.float64, device=logits.device)
    starts = torch.cumsum(torch.as_tensor([0, *lengths[:-1]], device=logits.device), 0)
    first = logits[starts]
    rank = (first > first.gather(1, targets[starts, None])).sum(dim=1) + 1
    return {"loglik": loglik.tolist(), "tokens": list(lengths), "exact": exact.int().tolist(),
            "first_rank": rank.tolist()}


def _xlogy(p: torch.Tensor, log_ratio: torch.Tensor) -> torch.Tensor:
    """``sum_v p(v) log_ratio(v)`` with 0 * anything = 0 (a token one model rules out, logit -inf, adds nothing)."""
    return torch.where(p > 0, p * log_ratio, 0.0).sum(-1)


def _x_log_x(x: torch.Tensor) -> torch.Tensor:
    """``sum_v x(v) log x(v)`` over the last axis, 0 log 0 = 0 (x below 1e-300 is logged as 1e-300, off by less than
    1e-297); the same arithmetic for a model and for a mixture, so that JS of two equal models is exactly 0."""
    return torch.linalg.vecdot(x, x.clamp_min(1e-300).log_())


def _kl_rows(lp: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(R, M, M) ``KL(a || b)`` per row for every pair of the M models of ``lp`` (R, M, V) and ``p = exp(lp)``."""
    cross = torch.bmm(p, lp.transpose(1, 2))  # sum_v p_a(v) log p_b(v)
    kl = torch.diagonal(cross, dim1=1, dim2=2)[:, :, None] - cross
    if not bool(torch.isnan(kl).any()):  # a -inf log-probability makes 0 * -inf = NaN in the product: redo by terms
        return kl
    m = lp.shape[1]
    return torch.stack([torch.stack([_xlogy(p[:, a], lp[:, a] - lp[:, b]) for b in range(m)], 1)
                        for a in range(m)], 1)


def divergences(logits: dict, pairs, lengths) -> dict[tuple, dict[str, list]]:
    """``{(a, b): {"kl_ab", "kl_ba", "js"}}``, one value per item, for each pair of models (float64).

    Args:
        logits (dict[str, Tensor]): model -> (N, V) logits of the same rows. pairs (Iterable[tuple[str, str]]).
        lengths (Sequence[int]): each item's T.
    """
    pairs = list(pairs)
    if not pairs:
        return {}
    names = sorted({m for p in pairs for m in p})
    at = {m: i for i, m in enumerate(names)}
    first = logits[names[0]]
    index = segments(lengths).to(first.device)
    n, rows = len(lengths), first.shape[0]
    sums = {p: {k: torch.zeros(n, dtype=torch.float64, device=first.device) for k in ("kl_ab", "kl_ba", "js")}
            for p in pairs}
    for lo, hi in _chunks(rows, first.shape[1], 2 * len(names)):
        lp = torch.stack([torch.log_softmax(logits[m][lo:hi].double(), dim=-1) for m in names], 1)  # (R, M, V)
        p = lp.exp()
        kl = _kl_rows(lp, p).clamp(min=0.0)
        neg_entropy = _x_log_x(p)  # (R, M): -H(p)
        for a, b in pairs:
            i, j = at[a], at[b]
            mixture = _x_log_x((p[:, i] + p[:, j]).mul_(0.5))
            js = (0.5 * (neg_entropy[:, i] + neg_entropy[:, j]) - mixture).clamp(min=0.0)
            s = sums[(a, b)]
            s["kl_ab"].index_add_(0, index[lo:hi], kl[:, i, j])
            s["kl_ba"].index_add_(0, index[lo:hi], kl[:, j, i])
            s["js"].index_add_(0, index[lo:hi], js)
    t = torch.as_tensor(list(lengths), dtype=torch.float64, device=first.device)
    return {p: {k: (v / t).tolist() for k, v in s.items()} for p, s in sums.items()}
