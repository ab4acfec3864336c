"""``vecmerge search``: candidates that raise the target's loglik and keep every protected set, found and written."""

from __future__ import annotations

from .. import requests as rq
from .app import main
from .generated import relay

relay(main, rq.Search, "search", "search", progress=True)
