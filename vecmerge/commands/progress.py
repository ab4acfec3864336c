"""The one progress-bar hand-off every command shares: ``progress(desc)`` or nothing."""

from __future__ import annotations


def progress_bar(progress, desc: str):
    return progress(desc) if progress else None
