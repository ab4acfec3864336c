"""``io.files``: only regular files are opened; a FIFO, device or socket is refused before it is opened."""

from __future__ import annotations

import os
import socket

import pytest

from vecmerge.errors import SpecialFileError
from vecmerge.io.files import check_folder, check_regular, open_regular
from vecmerge.io.hashing import sha256_file
from vecmerge.io.parse import load_json


def test_a_regular_file_opens_blocking_and_reads(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    with open_regular(tmp_path / "f") as f:
        assert f.read() == b"abc" and os.get_blocking(f.fileno())
    check_regular(tmp_path / "f")
    check_regular(tmp_path / "missing")  # the reader reports a missing file in its own words
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")
    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path)


def test_a_fifo_a_device_and_a_socket_are_refused_naming_what_they_are(tmp_path):
    os.mkfifo(tmp_path / "pipe")  # no writer: a plain open() would block forever
    with pytest.raises(SpecialFileError, match=r"pipe: is a FIFO \(named pipe\), not a regular file"):
        open_regular(tmp_path / "pipe")
    with pytest.raises(SpecialFileError, match="is a FIFO"):
        check_regular(tmp_path / "pipe")
    with pytest.raises(SpecialFileError, match="is a character device"):
        open_regular("/dev/zero")  # would never end
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(SpecialFileError, match="is a socket"):
            open_regular(tmp_path / "sock")
    finally:
        s.close()
    (tmp_path / "link").symlink_to(tmp_path / "pipe")  # links are followed to what they name
    with pytest.raises(SpecialFileError, match="link: is a FIFO"):
        open_regular(tmp_path / "link")


def test_the_readers_go_through_it(tmp_path):
    os.mkfifo(tmp_path / "x.json")
    for read in (lambda p: load_json(p), sha256_file):
        with pytest.raises(SpecialFileError, match="x.json: is a FIFO"):
            read(tmp_path / "x.json")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "ok.json").write_text("{}")
    check_folder(tmp_path / "folder")
    os.mkfifo(tmp_path / "folder" / "tokenizer.json")
    with pytest.raises(SpecialFileError, match="tokenizer.json: is a FIFO"):
        check_folder(tmp_path / "folder")
