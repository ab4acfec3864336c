"""The torch-free names and the rank policy's parsing and choice."""

import pytest
import torch

from vecmerge.errors import RecipeError
from vecmerge.linalg.rank_policy import RankPolicy


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

    code = "import sys, vecmerge.options, vecmerge.recipe.recipe; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_choose_step_energy_and_floor_against_hand_computed_tails():
    """step-energy:E keeps the smallest k with sum_{i>=k} S_i^2 <= (1 - E) ||step||^2 (the boundary included), never
    above the exact rank; the floor (round-off scale) lowers the exact rank, which caps every policy."""
    S = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)           # tails from k: 14, 5, 1, 0
    pol = RankPolicy.parse("step-energy:0.75")
    assert pol.choose(S, step_norm=2.0) == (2, 3)                     # (1 - 0.75) * 4 = 1: tail 1 <= 1 at k = 2
    assert pol.choose(S, step_norm=1.9) == (3, 3)                     # 0.9025: tail 1 > it, k = 3
    assert pol.choose(S, step_norm=100.0) == (0, 3)                   # 2500 >= 14: nothing needs keeping
    assert RankPolicy.parse("step-energy:1").choose(S, step_norm=1.0) == (3, 3)
    with pytest.raises(RecipeError, match=r"rank=step-energy:0.75: measures the step, and this update has none"):
        pol.choose(S)
    T = torch.tensor([3.0, 2.0, 1.0, 1e-6], dtype=torch.float64)
    assert RankPolicy.parse("exact").choose(T) == (4, 4)              # 1e-6 of ||S|| = 3.7 is rank (above 1e-9)
    assert RankPolicy.parse("exact").choose(T, floor=1e4) == (3, 3)   # 1e-6 <= 1e-9 * 1e4: round-off
    assert RankPolicy.parse("energy:1").choose(T, floor=1e4) == (3, 3)
    assert RankPolicy.parse("4").choose(T, floor=1e4) == (3, 3)
    assert RankPolicy.parse("step-energy:0.999").choose(T, floor=1e4, step_norm=1e-3) == (3, 3)


def test_parse_spellings_and_names():
    """Case and spaces are ignored; energy shares are written back with %g; fixed ranks as integers."""
    assert RankPolicy.parse(" Exact ") == RankPolicy("exact")
    assert RankPolicy.parse("KEEP-BASE") == RankPolicy("keep-base")
    assert RankPolicy.parse("12") == RankPolicy("fixed", 12) and str(RankPolicy("fixed", 12)) == "12"
    assert RankPolicy.parse("energy:1") == RankPolicy("energy", 1.0)
    assert RankPolicy.parse("step-energy:0.5") == RankPolicy("step-energy", 0.5)
    assert str(RankPolicy.parse("step-energy:0.5")) == "step-energy:0.5"
    with pytest.raises(RecipeError) as e:
        RankPolicy.parse("energy:")
    assert str(e.value) == ("recipe: rank='energy:': use 'exact', a positive integer, 'energy:E' or 'step-energy:E' "
                            "with 0 < E <= 1, or 'keep-base'")


def test_auto_is_a_rank_kind_of_extract_only_with_each_error_text_kept():
    """One rank policy: ``vecmerge extract``'s N, energy:E and auto (Gavish-Donoho) are RankPolicy kinds read by
    ``parse_extract``; a merge's ``parse`` refuses auto, extract refuses exact, step-energy and keep-base, each
    with its own text as before the two policies were one."""
    assert RankPolicy.parse_extract(" AUTO ") == RankPolicy("auto") and str(RankPolicy("auto")) == "auto"
    assert RankPolicy.parse_extract("8") == RankPolicy("fixed", 8) == RankPolicy.parse("8")
    assert RankPolicy.parse_extract("energy:0.9") == RankPolicy("energy", 0.9) and not RankPolicy("auto").lossless
    with pytest.raises(RecipeError) as e:
        RankPolicy.parse("auto")
    assert str(e.value) == ("recipe: rank='auto': use 'exact', a positive integer, 'energy:E' or 'step-energy:E' "
                            "with 0 < E <= 1, or 'keep-base'")
    for bad in ("exact", "keep-base", "step-energy:0.5", "energy:0", "auto:3"):
        with pytest.raises(RecipeError) as e:
            RankPolicy.parse_extract(bad)
        assert str(e.value) == f"extract: --rank {bad!r}: use a positive integer N, energy:E with 0 < E <= 1, or auto"
    with pytest.raises(RecipeError, match="rank=auto is extract's"):
        RankPolicy("auto").choose(torch.ones(3, dtype=torch.float64))
