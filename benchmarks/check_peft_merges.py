"""The measured claims of docs/PEFT-MERGES.md, on a two-``nn.Linear`` toy model (about 5 s).

Run: ``.venv/bin/python benchmarks/check_peft_merges.py``. Not a test: it prints PEFT's behaviour for the
note; ``tests/contracts/test_same_update_as_peft.py`` asserts what vecmerge's merges must match or fix.
"""

from __future__ import annotations

import warnings

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

# building blocks checked against PEFT's own (internal): the deterministic merge kernels
from vecmerge.linalg.merge_kernels import dare_ties, magnitude_prune, ties

warnings.filterwarnings("ignore")
MODULES = ("fc1", "fc2")


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 48), nn.Linear(48, 32)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def build(specs):
    """A PEFT model with one adapter per (name, LoraConfig kwargs), all factors random (B too)."""
    model = None
    for name, kw in specs:
        cfg = LoraConfig(target_modules=list(MODULES), **kw)
        if model is None:
            model = get_peft_model(Tiny(), cfg, adapter_name=name)
        else:
            model.add_adapter(name, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.1)
    return model


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def delta(model, name, mod="fc1"):
    return getattr(model.base_model.model, mod).get_delta_weight(name).detach()


def layers(model):
    return [getattr(model.base_model.model, m) for m in MODULES]


def rslora_scaling():
    m = build([("classic", dict(r=8, lora_alpha=16)), ("rs", dict(r=16, lora_alpha=16, use_rslora=True))])
    want = delta(m, "classic") + delta(m, "rs")
    for order in (["classic", "rs"], ["rs", "classic"]):
        for ct in ("cat", "svd"):
            nm = f"{ct}_{order[0]}"
            m.add_weighted_adapter(order, [1.0, 1.0], nm, combination_type=ct, svd_rank=24 if ct == "svd" else None)
            got, lay = delta(m, nm), m.base_model.model.fc1
            print(f"{ct} first={order[0]}: r={lay.r[nm]} scaling={lay.scaling[nm]:.4f} "
                  f"rel_err={rel(got, want):.3e} norm ratio={float(got.norm() / want.norm()):.4f}")


def factorwise_linear():
    m = build([("a", dict(r=8, lora_alpha=16)), ("b", dict(r=8, lora_alpha=16))])
    for i, w in enumerate(([1.0, 1.0], [0.5, 0.5], [1.0, -1.0])):
        m.add_weighted_adapter(["a", "b"], w, f"lin{i}", combination_type="linear")
        want = w[0] * delta(m, "a") + w[1] * delta(m, "b")
        print(f"linear {w}: rel_err {rel(delta(m, f'lin{i}'), want):.3f}")


def svd_variants_at_full_rank():
    m = build([("a", dict(r=8, lora_alpha=16)), ("b", dict(r=8, lora_alpha=16))])
    kernels = {"ties_svd": lambda X, w: ties(X, w, 0.5), "magnitude_prune_svd": lambda X, w: magnitude_prune(X, w, 0.5)}
    for ct, fn in kernels.items():
        for i, w in enumerate(([1.0, 1.0], [0.3, 0.7])):
            nm = f"{ct}{i}"
            m.add_weighted_adapter(["a", "b"], w, nm, combination_type=ct, density=0.5, svd_rank=32)
            X = torch.stack([delta(m, "a"), delta(m, "b")])
            print(f"{ct} {w}: vs ours {rel(delta(m, nm), fn(X, torch.tensor(w))):.2e} (float32 weights), "
                  f"{rel(delta(m, nm).double(), fn(X.double(), w)):.2e} (exact weights, float64)")
    try:
        m.add_weighted_adapter(["a", "b"], [1.0, 1.0], "big", combination_type="svd", svd_rank=40)
        print("svd_rank=40: no error")
    except RuntimeError as e:
        print(f"svd_rank=40 on a 48 x 32 module: {str(e)[:80]}")


def dare_stream():
    m = build([("a", dict(r=8, lora_alpha=16)), ("b", dict(r=8, lora_alpha=16))])
    torch.manual_seed(5)
    m.add_weighted_adapter(["a", "b"], [1.0, 1.0], "plain", combination_type="svd", svd_rank=32)
    after = torch.get_rng_state()
    g = torch.Generator().manual_seed(5)
    for lay in layers(m):  # inject_adapter: nn.Linear(in, r) init, nn.Linear(r, out) init, kaiming_uniform_(A)
        for shape in ((32, lay.in_features), (lay.out_features, 32), (32, lay.in_features)):
            torch.empty(*shape).uniform_(generator=g)
    print("emulated injection reaches PEFT's RNG state:", torch.equal(g.get_state(), after))
    for naive in (True, False):
        torch.manual_seed(5)
        nm = f"dt{int(naive)}"
        m.add_weighted_adapter(["a", "b"], [1.0, 1.0], nm, combination_type="dare_ties_svd", density=0.5, svd_rank=32)
        g = torch.Generator().manual_seed(5)
        if not naive:
            for lay in layers(m):
                for shape in ((32, lay.in_features), (lay.out_features, 32), (32, lay.in_features)):
                    torch.empty(*shape).uniform_(generator=g)
        for mod in MODULES:
            ours = dare_ties(torch.stack([delta(m, "a", mod), delta(m, "b", mod)]), torch.tensor([1.0, 1.0]), 0.5, g)
            how = "seed only" if naive else "seed + injection draws"
            print(f"dare_ties_svd {mod} vs ours ({how}): rel diff {rel(delta(m, nm, mod), ours):.2e}")


if __name__ == "__main__":
    torch.manual_seed(0)
    rslora_scaling()
    factorwise_linear()
    svd_variants_at_full_rank()
    dare_stream()
