"""A ``project`` recipe's step by verify's own path: the consensus, the mode's coefficients and alpha (numpy).

``fill_step(d, r, method)`` fills a ``derive.Derivation`` of a stepped recipe: per module (worker threads) the
backbone's and direction's norms, the consensus sign against ``ref``, the mode's coefficients of ``dir'_m``
(add: ``k dir``; orthogonal: ``k (dir - <dir, base> / ||base||^2 base)``; onto-ref: ``k max(<dir, ref>, 0) /
||ref||^2 ref``), then the drops, ``min_agree`` and alpha: ``T ||base|| / ||dir'||`` globally or per module,
``--alpha`` clipped to that bound, times the dose (see ``derive``'s docstring).
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .stack import ZERO_RTOL

if TYPE_CHECKING:
    from .derive import Derivation


def multiplier(recipe: dict, m: str) -> float:
    """Module m's multiplier: the value of the first ``multipliers`` pattern it matches (``re.search``), else 1."""
    for pat, v in (recipe.get("multipliers") or {}).items():
        if re.search(pat, m):
            return float(v)
    return 1.0


def selected(recipe: dict, m: str) -> bool:
    """Whether ``only`` (if given) matches module m and ``exclude`` (if given) does not."""
    only, excl = recipe.get("only"), recipe.get("exclude")
    return (only is None or re.search(only, m) is not None) and not (excl is not None and re.search(excl, m))


def _module_step(d: Derivation, r: dict, method: str, m: str) -> dict:
    """Module m's part of the step's pass: its norms, its consensus sign and the mode's coefficients."""
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # per thread: errstate is thread-local
        base = d.operand("base", m)
        out: dict[str, Any] = {"bn": base.norm(), "dn": 0.0}
        if not selected(r, m):  # only/exclude: no step, and no say in the consensus
            return out
        direction = d.operand("dir", m)
        nd = direction.norm()
        dir_zero = nd <= ZERO_RTOL * direction.bound
        ref = d.operand("ref", m) if "ref" in d.forms else None
        nr = ref.norm() if ref is not None else 0.0
        if ref is not None and (r.get("consensus") or {}).get("ref") and not (nr <= ZERO_RTOL * ref.bound
                                                                               or dir_zero):
            out["sign"] = -1 if ref.inner(direction) < 0 else 1
        k = multiplier(r, m)
        if method == "add":
            out.update(c=(k, 0.0, None), dn=abs(k) * nd)
        elif method == "orthogonal":
            nb = out["bn"]
            a = direction.inner(base) / (nb * nb) if nb else 0.0
            dn = (direction + base.scaled(-a)).norm() if a != 0.0 else nd  # by QR: nothing cancels
            out.update(c=(k, -a * k, None), dn=abs(k) * dn)
        else:
            a = direction.inner(ref) / (nr * nr) if nr and ref is not None else 0.0
            c = max(a, 0.0) * k
            out.update(c=(0.0, 0.0, c), dn=abs(c) * nr, zeroed=a <= 0 and not dir_zero and k != 0)
        if m in d.protect and "c" in out:  # the projected direction's own norm
            out["dn"] = d.stepped_dir(m, base, direction, out["c"]).norm()
        return out


def fill_step(d: Derivation, r: dict, method: str, threads: int = 2) -> None:
    """The consensus, the mode's coefficients and alpha of a project recipe: one pass over the modules on
    worker threads (each operand read once, each norm taken once), summed in module order."""
    with ThreadPoolExecutor(max(1, threads)) as pool:
        rows = dict(zip(d.names, pool.map(lambda m: _module_step(d, r, method, m), d.names)))
    bn = {m: x["bn"] for m, x in rows.items()}
    dn = {m: x["dn"] for m, x in rows.items()}
    d.coeff = {m: x["c"] for m, x in rows.items() if "c" in x}
    d.zeroed = [m for m, x in rows.items() if x.get("zeroed")]
    cons = r.get("consensus") or {}
    if cons.get("ref"):
        signs = {m: x["sign"] for m, x in rows.items() if "sign" in x}
        bad = [m for m, v in signs.items() if v < 0]
        agree, signed = len(signs) - len(bad), len(signs)
        share = agree / signed if signed else 0.0
        if cons.get("min_agree") is not None and share < cons["min_agree"]:
            d.problems.append(f"consensus: {agree}/{signed} agree < min_agree {cons['min_agree']}")
        if bad and cons.get("on_disagree", "fail") == "fail":
            d.problems.append(f"consensus: {len(bad)} module(s) disagree and on_disagree is fail")
        if cons.get("on_disagree") == "drop":
            d.dropped = bad
            for m in bad:
                d.coeff.pop(m, None)
                dn[m] = 0.0
    d.dir_norms = dn
    _alpha(d, r, bn, dn)


def _alpha(d: Derivation, r: dict, bn: dict, dn: dict) -> None:
    """alpha by the trust region (``T ||base|| / ||dir'||``, global or per module), ``--alpha`` clipped to it."""
    trust, given, k = r.get("trust"), r.get("alpha"), float(r.get("multiple", 1.0))
    B, D = math.sqrt(sum(v * v for v in bn.values())), math.sqrt(sum(v * v for v in dn.values()))

    def bounded(b: float, n: float) -> float:
        bound = trust * b / n if (trust is not None and n) else (0.0 if trust is not None else math.inf)
        a = bound if given is None else given
        return math.copysign(min(abs(a), bound), a) if trust is not None else a

    if r.get("trust_scope", "global") == "global":
        a = bounded(B, D)
        d.alpha = a * k
        d.module_alpha = {m: a * k for m in d.names}
    else:
        d.module_alpha = {m: bounded(bn[m], dn[m]) * k for m in d.names}
    step = math.sqrt(sum((abs(d.module_alpha[m]) * dn[m]) ** 2 for m in d.names))
    d.realized = step / B if B else None
