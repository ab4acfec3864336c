"""``io.safetensors_write``: no NaN or Inf is ever written (issue 23: ``extract --others save`` wrote a NaN)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from vecmerge.errors import NumericError
from vecmerge.io.safetensors_read import DTYPE_CODES
from vecmerge.io.safetensors_write import NONFINITE_MASKS, SafetensorsWriter, nonfinite, tensor_bytes


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.float8_e5m2, torch.float8_e4m3fn])
def test_nonfinite_counts_nan_and_inf_exactly_in_every_float_dtype(dtype):
    info = torch.finfo(dtype)
    values = torch.tensor([0.0, -0.0, 1.0, info.max, -info.max, info.tiny, info.tiny / 4], dtype=torch.float64)
    values = values.to(dtype)
    code = DTYPE_CODES[dtype]
    assert code in NONFINITE_MASKS and nonfinite(tensor_bytes(values), code) == 0  # extremes are finite
    bad = torch.tensor([float("nan"), 1.0, float("-nan"), 2.0]).to(dtype)
    if dtype != torch.float8_e4m3fn:  # it has no Inf (an overflow saturates to NaN)
        bad = torch.cat([bad, torch.tensor([float("inf"), float("-inf")]).to(dtype)])
    assert nonfinite(tensor_bytes(bad), code) == int((~torch.isfinite(bad.float())).sum())
    assert nonfinite(tensor_bytes(torch.tensor([1, 2], dtype=torch.int32)), "I32") == 0


def test_the_writer_refuses_a_nan_naming_the_tensor_even_across_pieces(tmp_path):
    good, bad = torch.ones(5), torch.tensor([1.0, 2.0, float("nan"), 3.0])
    w = SafetensorsWriter(tmp_path / "x.safetensors", [("good", "F32", (5,)), ("bad", "F32", (4,))])
    w.write("good", good)
    raw = bytes(tensor_bytes(bad))
    with pytest.raises(NumericError, match=r"x.safetensors: tensor bad holds 1\+ NaN/Inf value\(s\) \(F32\)"):
        w.write("bad", [raw[:3], raw[3:9], raw[9:]])  # pieces that end inside a value
    w.abort()
    w = SafetensorsWriter(tmp_path / "y.safetensors", [("ok", "BF16", (4,))])
    ok = torch.tensor([1.0, -2.0, 3e38, -3e38]).to(torch.bfloat16)
    piece = bytes(tensor_bytes(ok))
    w.write("ok", [piece[:1], piece[1:5], piece[5:]])
    w.close()
    assert torch.equal(load_file(str(tmp_path / "y.safetensors"))["ok"], ok)
