"""The safetensors reader (TensorFile, ModelFolder) and streaming writer against the safetensors library and hashlib.

Every check here is exact: tensors equal bit for bit (``torch.equal``), sha256 equal to hashlib's over
the whole file, headers refused with a ``ModelError`` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vecmerge.errors import ModelError
from vecmerge.io.model_folder import INDEX_NAME, ModelFolder
from vecmerge.io.safetensors_read import TensorFile
from vecmerge.io.safetensors_write import SafetensorsStream, SafetensorsWriter, write_index


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensors(seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.weight": torch.randn(3, 4, generator=g).bfloat16(),
            "c.bias": torch.randn(6, generator=g).half(), "d.ids": torch.arange(9, dtype=torch.int64),
            "e.empty": torch.zeros(0, 3), "f.scalar": torch.tensor(2.5, dtype=torch.float64)}


def folder(tmp_path, shards: list[dict] | None = None, name="m"):
    root = tmp_path / name
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if shards is None:
        save_file(tensors(), str(root / "model.safetensors"), metadata={"format": "pt"})
        return root
    wmap = {}
    for i, sd in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sd, str(root / fname), metadata={"format": "pt"})
        wmap.update({k: fname for k in sd})
    write_index(root / INDEX_NAME, wmap, 0)
    return root


def test_writer_output_loads_with_safetensors_and_hashes_as_written(tmp_path):
    sd = tensors()
    w = SafetensorsWriter(tmp_path / "x.safetensors", [(k, {torch.float32: "F32", torch.bfloat16: "BF16",
                                                               torch.float16: "F16", torch.int64: "I64",
                                                               torch.float64: "F64"}[t.dtype], tuple(t.shape))
                                                         for k, t in sd.items()], {"format": "pt"})
    for k, t in sd.items():
        w.write(k, t)
    w.close()
    back = load_file(str(tmp_path / "x.safetensors"))
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert w.sha256() == sha(tmp_path / "x.safetensors")


def test_writer_refuses_out_of_order_and_wrong_size(tmp_path):
    w = SafetensorsWriter(tmp_path / "y.safetensors", [("a", "F32", (2,)), ("b", "F32", (3,))])
    with pytest.raises(ModelError, match="expected a"):
        w.write("b", torch.zeros(3))
    with pytest.raises(ModelError, match="bytes"):
        w.write("a", torch.zeros(3))
    w.abort()


def _stream_groups(n=6):
    """n modules of (A (r, 5), B (7, r)) with r = 1..n, bounded by rank 9 (two digits would be 10)."""
    g = torch.Generator().manual_seed(1)
    made = {f"m{i}": {f"m{i}.A": torch.randn(i + 1, 5, generator=g).bfloat16(),
                      f"m{i}.B": torch.randn(7, i + 1, generator=g).bfloat16()} for i in range(n)}
    groups = [(m, [(f"{m}.A", "BF16", (9, 5)), (f"{m}.B", "BF16", (7, 9))]) for m in made]
    return made, groups


def test_stream_writes_in_declared_order_whatever_the_put_order(tmp_path):
    """Tensors put from 3 threads in shuffled order: the file equals the one from puts in order byte for byte,
    loads with safetensors bit for bit, its header is the exact one padded with spaces to a multiple of 8,
    and close() returns hashlib's sha256 of the whole file."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    made, groups = _stream_groups()
    files = []
    for k, order in enumerate((list(made), random.Random(3).sample(list(made), len(made)))):
        path = tmp_path / f"s{k}.safetensors"
        st = SafetensorsStream(path, groups, {"format": "pt"})
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda m, st=st: st.put(m, made[m]), order))
        assert st.close() == sha(path)
        files.append(path.read_bytes())
    assert files[0] == files[1]
    got = load_file(str(tmp_path / "s1.safetensors"))
    want = {k: t for ts in made.values() for k, t in ts.items()}
    assert list(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    n = struct.unpack("<Q", files[0][:8])[0]
    head = files[0][8:8 + n]
    assert n % 8 == 0 and head.rstrip(b" ") == head.rstrip() and json.loads(head)["__metadata__"] == {"format": "pt"}
    offsets = [json.loads(head)[k]["data_offsets"] for ts in made.values() for k in ts]
    assert offsets[0][0] == 0 and all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))  # declared order


def test_stream_refuses_shapes_over_their_bounds_and_missing_groups(tmp_path):
    made, groups = _stream_groups(2)
    st = SafetensorsStream(tmp_path / "a.safetensors", groups)
    with pytest.raises(ModelError, match=r"m0.A is torch.bfloat16 \(10, 5\), over its bound BF16 \(9, 5\)"):
        st.put("m0", {"m0.A": torch.zeros(10, 5).bfloat16(), "m0.B": made["m0"]["m0.B"]})
    with pytest.raises(ModelError, match="unexpected tensors"):
        st.put("m0", {"m0.A": made["m0"]["m0.A"]})
    st.put("m1", made["m1"])  # early: held until m0 comes
    with pytest.raises(ModelError, match="2 modules were not written"):
        st.close()
    st.abort()


def test_reader_matches_safetensors_and_hashes_single_file(tmp_path):
    root = folder(tmp_path)
    ref = load_file(str(root / "model.safetensors"))
    with ModelFolder(root) as m:
        for name in m.in_file_order():
            assert torch.equal(m.read(name), ref[name])
        assert m.sha256s() == {"config.json": sha(root / "config.json"),
                               "model.safetensors": sha(root / "model.safetensors")}
        assert not m.sharded and m.model_type == "llama" and m.files[0].metadata == {"format": "pt"}


def test_reader_sharded_out_of_order_reads_still_hash_right(tmp_path):
    sd = tensors()
    keys = list(sd)
    root = folder(tmp_path, [{k: sd[k] for k in keys[:3]}, {k: sd[k] for k in keys[3:]}])
    with ModelFolder(root) as m:
        assert m.sharded and len(m.files) == 2
        for name in reversed(m.in_file_order()):
            assert torch.equal(m.read(name), sd[name])
        got = m.sha256s()
        assert got[INDEX_NAME] == sha(root / INDEX_NAME)
        assert all(got[f.path.name] == sha(f.path) for f in m.files)


def test_other_files_skip_weights_index_and_hidden(tmp_path):
    root = folder(tmp_path)
    for n in ("tokenizer.json", ".hidden", "pytorch_model.bin", "README.md"):
        (root / n).write_text("x")
    with ModelFolder(root) as m:
        assert m.other_files() == ["README.md", "config.json", "tokenizer.json"]


def _corrupt(tmp_path, header: dict, data: bytes = b"", length: int | None = None):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "config.json").write_text("{}")
    raw = json.dumps(header).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return root


@pytest.mark.parametrize("header,data,length,match", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"", None, "does not fit"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "does not fit"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "dtype 'Q4'"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None, "overlap"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "malformed"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 1 << 40, "not a safetensors"),
    ({"__metadata__": {"a": 1}}, b"", None, "__metadata__"),
])
def test_hostile_headers_are_refused(tmp_path, header, data, length, match):
    with pytest.raises(ModelError, match=match):
        ModelFolder(_corrupt(tmp_path, header, data, length))


def test_index_problems_are_refused(tmp_path):
    sd = tensors()
    root = folder(tmp_path, [{"a.weight": sd["a.weight"], "b.weight": sd["b.weight"]}, {"c.bias": sd["c.bias"]}])
    idx = json.loads((root / INDEX_NAME).read_text())
    idx["weight_map"]["a.weight"] = "../escape.safetensors"
    (root / INDEX_NAME).write_text(json.dumps(idx))
    with pytest.raises(ModelError, match="plain file name"):
        ModelFolder(root)
    idx["weight_map"]["a.weight"] = "model-00002-of-00002.safetensors"
    (root / INDEX_NAME).write_text(json.dumps(idx))
    with pytest.raises(ModelError, match="disagree"):
        ModelFolder(root)
    idx["weight_map"] = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00001-of-00002.safetensors",
                         "c.bias": "gone.safetensors"}
    (root / INDEX_NAME).write_text(json.dumps(idx))
    with pytest.raises(ModelError, match="missing"):
        ModelFolder(root)


def test_missing_weights_and_config(tmp_path):
    root = tmp_path / "nothing"
    root.mkdir()
    with pytest.raises(ModelError, match="config.json"):
        ModelFolder(root)
    (root / "config.json").write_text("{}")
    (root / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="save_pretrained it again"):
        ModelFolder(root, "--tuned")
    with pytest.raises(ModelError, match="no such folder"):
        ModelFolder(tmp_path / "absent")


def test_a_loaded_file_is_read_once_hashed_as_hashlib_and_its_tensors_equal_safetensors(tmp_path):
    """``TensorFile.load``: the whole file in memory, its sha256 equal to hashlib's over the file, every tensor
    (aligned or not) bit for bit the safetensors library's; read tensor by tensor without holding the file open
    (``keep_open=False``) gives the same tensors."""
    p = tmp_path / "x.safetensors"
    sd = tensors()
    save_file(sd, str(p), metadata={"format": "pt"})
    ref = load_file(str(p))
    per_read = TensorFile(p, keep_open=False)
    assert not per_read.loaded and all(torch.equal(per_read.tensor(k), ref[k]) for k in sd)
    f = TensorFile(p, keep_open=False)
    assert f.load() == sha(p) == f.sha256() and f.loaded
    assert all(torch.equal(f.tensor(k), ref[k]) for k in sd)


def test_a_file_replaced_after_its_header_was_checked_is_refused(tmp_path):
    """A file opened (header checked) and then replaced is refused on the first read or on ``load``, never read
    with the old offsets."""
    p = tmp_path / "x.safetensors"
    save_file(tensors(0), str(p))
    per_read, whole = TensorFile(p, keep_open=False), TensorFile(p, keep_open=False)
    save_file({k: v for k, v in tensors(1).items() if k != "c.bias"}, str(p))
    with pytest.raises(ModelError, match=r"x.safetensors: changed while being read"):
        per_read.tensor("a.weight")
    with pytest.raises(ModelError, match=r"x.safetensors: changed while being read"):
        whole.load()
