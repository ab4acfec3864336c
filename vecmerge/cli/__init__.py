"""The vecmerge command (the only importer of click): ``vecmerge.cli:main`` is the console script."""

from .main import main

__all__ = ["main"]
