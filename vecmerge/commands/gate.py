"""``vecmerge gate``: the seven conditions of a planned step, judged on the workspace and the ledger."""

from __future__ import annotations

from ..errors import CheckFailed
from ..pipeline.gate_check import check_gate
from ..recipe.recipe import Consensus, Recipe
from ..report import evidence as report_evidence
from ..requests import Gate
from ..workspace.names import Workspace
from .printing import Echo, say, show_path
from .progress import progress_bar


def gate_dict(check) -> dict:
    """``GateCheck.to_dict`` with the ledger shown relative to the current folder (the manifest keeps it whole)."""
    return {**check.to_dict(), "ledger": show_path(check.ledger)}


def gate(ws: Workspace, req: Gate, *, echo: Echo = print, progress=None) -> dict:
    """``vecmerge gate --base B --dir X-Y [--consensus-ref R] [--trust T] [--metric M] [--env ID|K=V]``: the seven
    conditions (``--env``: the eval environment of the evidence rows, over ``gate: env:``).

    The same facts ``project --gate`` judges (``pipeline.gate.check_gate``); the consensus is counted, never
    enforced here (``on_disagree: keep``). Raises CheckFailed (exit 1) unless every condition passes.
    """
    recipe = Recipe(base=req.base, dir=req.direction, trust=req.trust, method="add",
                    consensus=Consensus(req.consensus_ref, "keep") if req.consensus_ref else None,
                    gate={**({"metric": req.metric} if req.metric else {}),
                          **({"env": list(req.env)} if req.env else {})} or True)
    check = check_gate(recipe, ws, progress_bar(progress, "gate"))
    out = gate_dict(check)
    say(echo, out, report_evidence.render_gate, req.as_json)
    if not check.passed:
        bad = [f"{r['condition']} {r['status']}" for r in out["rows"] if r["status"] != "PASS"]
        raise CheckFailed(f"gate: {len(bad)} of {len(out['rows'])} conditions did not pass ({', '.join(bad)})")
    return out
