"""``vecmerge rank``: new candidates ranked by a proxy that passed a held-out calibration, else flagged."""

from __future__ import annotations

from .. import requests as rq
from .app import main
from .generated import relay

relay(main, rq.Rank, "rank", "rank")
