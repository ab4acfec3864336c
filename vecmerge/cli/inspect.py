"""``vecmerge inspect`` and ``vecmerge audit``: what adapters are, and how trajectories agree."""

from __future__ import annotations

from .. import requests as rq
from .app import main
from .generated import relay

relay(main, rq.Inspect, "inspect", "inspect", progress=True)
relay(main, rq.Audit, "audit", "audit", progress=True)
