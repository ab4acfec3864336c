"""``vecmerge probe``: checkpoints teacher-forced on a prompt file; function-space evidence into the ledger."""

from __future__ import annotations

from .. import requests as rq
from .app import main
from .generated import relay

relay(main, rq.Probe, "probe", "probe", progress=True)
