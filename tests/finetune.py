"""Tiny random transformers models and their full fine-tunes, made in the tests (no hub).

``make_pair(root, arch)`` saves ``root/base`` and ``root/tuned``: a model built from a config with a fixed
seed, then every parameter trained for a few AdamW steps on seeded random tokens (a real full
fine-tune: every matrix, norm and embedding moves). ``logits(folder_or_model, ids)`` runs a forward in
float64 logits.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

VOCAB = 96
ARCHS = {
    # hidden 32: every matrix takes the full-SVD path
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, tie_word_embeddings=False, max_position_embeddings=64)),
    # hidden 256: rank-8 cuts take the randomized path (min side 128..256 > 4 (8 + 10))
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=384, num_hidden_layers=1,
                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                   max_position_embeddings=64)),
    # Conv1D (weights stored (in, out)), tied embeddings, biases everywhere
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)),
}


def build(arch: str, seed: int = 0):
    import transformers

    cfg_name, model_name, kwargs = ARCHS[arch]
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kwargs))


def finetune(model, steps: int = 4, lr: float = 3e-3, seed: int = 1, freeze=()):
    """Train every parameter (but those whose name contains one of ``freeze``) for ``steps`` AdamW steps."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        p.requires_grad_(not any(f in name for f in freeze))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    vocab = model.config.vocab_size
    for _ in range(steps):
        ids = torch.randint(0, vocab, (4, 16), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return model


def save(model, path: Path, **kwargs) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path, **kwargs)
    return path


def make_pair(root: Path, arch: str, *, resize: int | None = None, freeze=(), steps: int = 4) -> tuple[Path, Path]:
    """``(root/base, root/tuned)``: a tiny model and its full fine-tune (vocabulary resized to ``resize`` first)."""
    model = build(arch)
    base = save(model, Path(root) / "base")
    if resize is not None:
        model.resize_token_embeddings(resize)
    tuned = save(finetune(model, steps=steps, freeze=freeze), Path(root) / "tuned")
    return base, tuned


def prompt(seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(seed))


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    """float64 logits of ``model`` (a module, or a folder loaded with AutoModelForCausalLM)."""
    if isinstance(model, (str, Path)):
        from transformers import AutoModelForCausalLM

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        return model(input_ids=ids).logits.double()


def rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a - b| / max|b|``."""
    return float((a - b).abs().max() / b.abs().max())
