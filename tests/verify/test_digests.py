"""verify.digests: one hash per file per verify call, keyed by path, inode, size and mtime."""

import os

from vecmerge.verify.digests import digest, one_call


def counting(calls: list, value: str):
    return lambda: calls.append(value) or value


def test_a_file_is_hashed_once_per_call_and_again_in_the_next(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"abc")
    calls: list = []
    with one_call():
        assert digest(f, counting(calls, "h1")) == "h1"
        assert digest(tmp_path / "." / "w.safetensors", counting(calls, "h2")) == "h1"  # the same file, resolved
    assert calls == ["h1"]
    with one_call():
        assert digest(f, counting(calls, "h3")) == "h3"  # a new call starts empty
    assert digest(f, counting(calls, "h4")) == "h4" and digest(f, counting(calls, "h5")) == "h5"  # no call: no cache


def test_a_file_written_in_between_is_hashed_again(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"abc")
    with one_call():
        assert digest(f, lambda: "old") == "old"
        f.write_bytes(b"abd")  # same size: the mtime (ns) moves
        os.utime(f, ns=(1, 1))
        assert digest(f, lambda: "new") == "new"


def test_a_file_changed_while_hashed_is_not_kept(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"abc")

    def racing():
        f.write_bytes(b"abcd")
        return "torn"

    with one_call():
        assert digest(f, racing) == "torn"
        assert digest(f, lambda: "whole") == "whole"
