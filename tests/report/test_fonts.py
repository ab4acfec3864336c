"""The font for names the default font cannot draw: what it lacks, and never a font whose glyphs are all boxes."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from vecmerge.report.fonts import glyph_font, missing_glyphs  # noqa: E402


def test_missing_glyphs_are_the_characters_dejavu_sans_lacks_in_first_seen_order():
    from matplotlib import font_manager

    dejavu = set(font_manager.get_font(font_manager.findfont("DejaVu Sans")).get_charmap())
    assert ord("模") not in dejavu and ord("é") in dejavu  # the independent reference: the font file's own map
    assert missing_glyphs(["v58 (n=3)", "official_total / café"]) == ""
    assert missing_glyphs(["模型 甲", "a模\n理"]) == "模型甲理"


def test_a_font_found_for_chinese_has_every_glyph_and_is_not_last_resort():
    from matplotlib import font_manager

    family = glyph_font("模型甲")
    if family is None:
        pytest.skip("no CJK font on this machine (the fallback is tested in test_plots.py)")
    assert not family.startswith("Last Resort")  # its charmap covers everything with boxes
    path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
    assert {ord(c) for c in "模型甲"} <= set(font_manager.get_font(path).get_charmap())
