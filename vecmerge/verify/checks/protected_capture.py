"""verify's own capture of a protected step's inputs: the base model, the backbone added by its own hooks.

One item at a time (no batch, so no padding to leave out), in float32 as the step's capture runs, each targeted
module's input rows summed as ``G = X^T X`` in float64 numpy, one Gram per module (no sharing to get wrong). The
backbone is verify's own re-derived ``base_m = B A`` (``verify.independent.derive``), added to each module's output.
The prompt files are read by probe's reader (the file format and its tokenization, not the step's arithmetic).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ...errors import ModelError
from ...probe.prompts import read_prompts


def capture_inputs(base_model: Path, backbone: dict, files: dict, modules: list) -> tuple[dict, dict]:
    """``({set: {module: G (in, in) float64}}, {set: PromptSet})`` for every prompt file of ``files`` (embedding
    modules, which read token ids, are neither captured nor projected, as in the step).

    Args:
        base_model (Path): the transformers model folder. backbone (dict[str, tuple[ndarray, ndarray]]): module ->
            (B (out, k), A (k, in)) float64, the backbone's update ``B A``. files (dict[str, str]): set -> prompt file.
        modules (list[str]): the modules whose inputs are captured.
    """
    from transformers import AutoModelForCausalLM

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32).eval()
    except Exception as e:  # anything transformers raises is the finding
        raise ModelError(f"--base-model {base_model}: transformers cannot load it ({type(e).__name__})") from None
    sets = {k: read_prompts(f, base_model, stem=k) for k, f in files.items()}
    rows: dict = {}
    weights = {m: (torch.from_numpy(B).float(), torch.from_numpy(A).float()) for m, (B, A) in backbone.items()}

    def hook(m: str):
        def add(module, args, output):
            x = args[0]
            if m in modules:
                X = x.reshape(-1, x.shape[-1]).double().numpy()
                rows[m] = rows[m] + X.T @ X if m in rows else X.T @ X
            if m in weights:
                B, A = weights[m]
                return output + (x @ A.T) @ B.T
            return None

        return add

    modules = [m for m in modules if not isinstance(model.get_submodule(m), torch.nn.Embedding)]  # ids: no rows
    weights = {m: w for m, w in weights.items() if not isinstance(model.get_submodule(m), torch.nn.Embedding)}
    handles = [model.get_submodule(m).register_forward_hook(hook(m)) for m in sorted(set(modules) | set(weights))]
    grams = {}
    try:
        with torch.no_grad():
            for k, ps in sets.items():
                rows.clear()
                for it in ps.items:
                    model(input_ids=torch.tensor([list(it.prompt_ids + it.target_ids)]), use_cache=False)
                grams[k] = {m: rows[m] for m in modules if m in rows}
    finally:
        for h in handles:
            h.remove()
    return grams, sets
