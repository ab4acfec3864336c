"""The torch-free names and the rank policy's parsing and choice."""

import pytest
import torch

from vecmerge.errors import RecipeError
from vecmerge.options import RankPolicy


def test_rank_policy_parse_errors():
    for bad in ("0", "-3", "energy:0", "energy:1.5", "energy:x", "big"):
        with pytest.raises(RecipeError, match="rank="):
            RankPolicy.parse(bad)
    for text in ("exact", "7", "energy:0.999", "keep-base"):
        assert str(RankPolicy.parse(text)) == text
    assert RankPolicy.parse("keep-base").lossless and not RankPolicy.parse("7").lossless


def test_choose_never_exceeds_the_exact_rank():
    S = torch.tensor([3.0, 2.0, 1.0, 1e-14], dtype=torch.float64)
    assert RankPolicy.parse("exact").choose(S) == (3, 3)
    assert RankPolicy.parse("10").choose(S) == (3, 3)
    assert RankPolicy.parse("2").choose(S) == (2, 3)
    # energy: 9 / 14 = 0.643 < 0.7 <= 13 / 14 = 0.929
    assert RankPolicy.parse("energy:0.7").choose(S) == (2, 3)
    with pytest.raises(RecipeError, match="keep-base"):
        RankPolicy.parse("keep-base").choose(S)


def test_options_import_no_torch():
    import subprocess
    import sys

    code = "import sys, vecmerge.options, vecmerge.recipe; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
