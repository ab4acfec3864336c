"""The evidence renderers and the plot writer: atomic, never over an input, one table per command."""

from __future__ import annotations

import pytest

from vecmerge.errors import OutputError
from vecmerge.report_evidence import render_gate, write_atomic


def test_write_atomic_replaces_whole_and_refuses_inputs(tmp_path):
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
    adapter = tmp_path / "v51"
    adapter.mkdir()
    for bad, match in ((adapter / "x.png", "would overwrite an input"), (target, "would overwrite an input"),
                       (adapter, "would overwrite an input"), (tmp_path / "no" / "x.png", "does not exist")):
        with pytest.raises(OutputError, match=match):
            write_atomic(bad, b"x", inputs=[adapter, target])
    assert target.read_bytes() == b"new"
    with pytest.raises(OutputError, match="is a folder"):
        write_atomic(adapter, b"x")


def test_render_gate_wraps_and_names_what_did_not_pass():
    rows = [{"condition": c, "status": s, "detail": "d " * 60, "threshold": "t", "source": "default", "numbers": {}}
            for c, s in (("common base", "PASS"), ("small trust region", "FAIL"), ("module consensus", "UNKNOWN"))]
    text = render_gate({"backbone": "v54", "x": "v51", "y": "v28", "metric": "acc", "ledger": "l.db", "rows": rows})
    assert text.splitlines()[0] == "gate: v54 + alpha * (v51 - v28); metric acc; ledger l.db"
    assert max(len(line) for line in text.splitlines()) < 160
    assert text.splitlines()[-1] == ("NOT PASSED: small trust region FAIL, module consensus UNKNOWN "
                                     "(UNKNOWN is not a pass)")


def test_write_atomic_makes_an_ordinary_file(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.png", b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.png").stat().st_mode) == 0o644
