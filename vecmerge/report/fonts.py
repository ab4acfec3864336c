"""A font for the glyphs matplotlib's default lacks (Chinese model and sub-score names), or one warning line.

    needed    the characters of a figure's texts that the default font (DejaVu Sans) has no glyph for
    found     an installed font that has every one of them: a known CJK family first (Noto Sans CJK, Source
              Han, WenQuanYi, ...), then any font matplotlib knows (not Last Resort, whose every glyph is a
              box), then CJK font files the system has but
              matplotlib's font cache predates (added for this process only; the cache is never written)
    used      as a fallback after the default font (matplotlib >= 3.6 picks a font per glyph), so Latin text
              draws exactly as before
    none      one ``MissingGlyphWarning`` naming the characters and a font to install; matplotlib's own
              per-glyph warnings are silenced (the boxes are said once), and the figure is still written
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Iterable, Iterator

__all__ = ["MissingGlyphWarning", "missing_glyphs", "glyph_font", "fonts_for"]

PREFERRED = ("Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Noto Sans SC",
             "Noto Serif CJK SC", "Source Han Sans SC", "Source Han Sans CN", "Source Han Sans",
             "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback", "AR PL UMing CN", "AR PL UKai CN",
             "Microsoft YaHei", "SimHei", "PingFang SC", "Hiragino Sans GB", "Arial Unicode MS")
BOXES = ("Last Resort",)  # maps every code point to a box: never a font "with the glyph"
CJK_FILES = re.compile(r"(cjk|wqy|wenquanyi|sourcehan|source-han|droidsansfallback|uming|ukai|yahei|simhei|"
                       r"pingfang|hiragino)", re.IGNORECASE)


class MissingGlyphWarning(UserWarning):
    """No installed font has some characters of a figure: they show as boxes (said once per figure)."""


def _charmap(path: str) -> frozenset[int]:
    from matplotlib import font_manager

    try:
        return frozenset(font_manager.get_font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


@functools.cache
def _default() -> tuple[str, frozenset[int]]:
    """The default font's family name and its code points."""
    import matplotlib
    from matplotlib import font_manager

    path = font_manager.findfont(font_manager.FontProperties(family=matplotlib.rcParams["font.family"]))
    return font_manager.get_font(path).family_name, _charmap(path)


def missing_glyphs(texts: Iterable[str]) -> str:
    """The characters of ``texts`` (in first-seen order, no whitespace) the default font has no glyph for."""
    have = _default()[1]
    return "".join(dict.fromkeys(c for t in texts for c in str(t) if not c.isspace() and ord(c) not in have))


@functools.lru_cache(maxsize=64)
def glyph_font(chars: str) -> str | None:
    """The family name of an installed font with a glyph for every one of ``chars`` (module docstring,
    "found"), or None.

    Args:
        chars (str): the characters the default font lacks (``missing_glyphs``).
    """
    from matplotlib import font_manager

    need = {ord(c) for c in chars}
    known = font_manager.fontManager.ttflist
    rank = {name: i for i, name in enumerate(PREFERRED)}
    for f in sorted(known, key=lambda f: (rank.get(f.name, len(rank)), f.name, f.fname)):
        if not f.name.startswith(BOXES) and need <= _charmap(f.fname):
            return f.name
    seen = {f.fname for f in known}
    for path in sorted(font_manager.findSystemFonts()):
        if path not in seen and CJK_FILES.search(path) and need <= _charmap(path):
            font_manager.fontManager.addfont(path)  # this process only: the on-disk cache is left as it is
            return font_manager.FontProperties(fname=path).get_name()
    return None


@contextlib.contextmanager
def fonts_for(texts: Iterable[str], what: str = "the plots") -> Iterator[str | None]:
    """Draw ``texts`` with a font that has their glyphs, inside this block (module docstring); yields the
    fallback family used (None: none needed, or none installed, which was warned once).

    Args:
        texts (Iterable[str]): every text the figure shows. what (str): named in the warning.
    """
    import matplotlib

    chars = missing_glyphs(texts)
    if not chars:
        yield None
        return
    family = glyph_font(chars)
    if family is None:
        shown = chars if len(chars) <= 12 else chars[:12] + "..."
        warnings.warn(f"{what}: no installed font has a glyph for {shown}: those characters show as boxes in the "
                      "figures (the Markdown and HTML text are unaffected); install a CJK font, e.g. Noto Sans CJK "
                      "(Debian: fonts-noto-cjk) or WenQuanYi (fonts-wqy-microhei)", MissingGlyphWarning, stacklevel=3)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            yield None
        return
    with matplotlib.rc_context({"font.family": [_default()[0], family]}):
        yield family
