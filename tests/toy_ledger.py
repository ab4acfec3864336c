"""The toy ledger the command tests share: v51 (five current runs and one of older weights), v28 and v54."""

from __future__ import annotations

from vecmerge.commands.recording import add
from vecmerge.evidence.ledger.ledger import Ledger

OLD, NEW, SHA28, SHA54 = "a" * 64, "b" * 64, "c" * 64, "d" * 64
V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]
M = "official_total"
CURRENT = {"v51": NEW, "v28": SHA28, "v54": SHA54}


def toy_ledger(path) -> Ledger:
    """A ledger at ``path`` with the toy records (11 of them, one stale under ``CURRENT``)."""
    ledger = Ledger(path)
    add(ledger, "v51", V51, metric=M, sha256=NEW, higher_is_better=True)
    add(ledger, "v28", [0.9836, 0.9890], metric=M, sha256=SHA28)
    add(ledger, "v54", [0.9940, 0.9950, 0.9946], metric=M, sha256=SHA54)  # constructed runs
    add(ledger, "v51", [0.90], metric=M, sha256=OLD, note="before retraining")
    return ledger
