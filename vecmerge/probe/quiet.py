"""transformers and PEFT kept quiet while probe loads a model or a tokenizer: their warnings, log lines and progress
bars would break the one-line report (a broken ``tokenizer.model`` alone printed five lines of library warnings)."""

from __future__ import annotations

import contextlib
import logging
import warnings


@contextlib.contextmanager
def quiet_libraries():
    """Silence transformers' logging and progress bars, PEFT's and sentencepiece's loggers and Python warnings
    for the block; every setting is restored after it."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    loggers = [logging.getLogger(n) for n in ("peft", "sentencepiece", "tokenizers")]
    levels = [lg.level for lg in loggers]
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
        if bars:
            hf_logging.enable_progress_bar()
