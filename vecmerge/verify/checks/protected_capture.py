"""verify's own capture of a protected step's inputs: the base model, the backbone added by its own hooks.

One item at a time (no batch, so no padding to leave out), in float32 as the step's capture runs, each targeted
module's input rows summed as ``G = X^T X`` in float64 numpy, one Gram per module (no sharing to get wrong). The
backbone is verify's own re-derived ``base_m = B A`` (``verify.independent.derive``), added to each module's output.
The prompt files are read by probe's reader (the file format and its tokenization, not the step's arithmetic).
Where the manifest records a sketch (``protection.inputs``: inputs wider than ``exact_width`` on more than
``2 sketch_rows`` positions), verify runs its own Frequent Directions (numpy SVD) over the rows in the step's order
(items by ``(-length, line)``, positions in order) and uses ``B^T B``; its bound is checked by ``protection_check``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from ...errors import ModelError
from ...probe.prompts import read_prompts


class _Sketch:
    """Frequent Directions (Liberty 2013) with a 2 l row buffer, shrunk to l rows by numpy's SVD when a row arrives
    at a full buffer (and at the end): ``B^T B <= X^T X <= B^T B + delta I``. Fewer than 2 l + 1 rows stay exact."""

    def __init__(self, width: int, ell: int):
        self.B, self.ell, self.fill, self.n, self.delta, self.trace = np.zeros((2 * ell, width)), ell, 0, 0, 0.0, 0.0

    def add(self, X: np.ndarray) -> None:
        for row in X:
            if self.fill == 2 * self.ell:
                self._shrink()
            self.B[self.fill], self.fill, self.n = row, self.fill + 1, self.n + 1
            self.trace += float(row @ row)

    def _shrink(self) -> None:
        _, s, Vt = np.linalg.svd(self.B, full_matrices=False)
        d = s[self.ell] ** 2
        self.B[:self.ell] = np.sqrt(np.maximum(s[:self.ell] ** 2 - d, 0.0))[:, None] * Vt[:self.ell]
        self.B[self.ell:], self.fill, self.delta = 0.0, self.ell, self.delta + d

    def gram(self) -> np.ndarray:
        if self.n > 2 * self.ell and self.fill == 2 * self.ell:
            self._shrink()
        B = self.B[:self.fill]
        return B.T @ B


def capture_inputs(base_model: Path, backbone: dict, files: dict, modules: list, sketch: dict | None = None,
                   info: dict | None = None) -> tuple[dict, dict]:
    """``({set: {module: G (in, in) float64}}, {set: PromptSet})`` for every prompt file of ``files`` (embedding
    modules, which read token ids, are neither captured nor projected, as in the step).

    Args:
        base_model (Path): the transformers model folder. backbone (dict[str, tuple[ndarray, ndarray]]): module ->
            (B (out, k), A (k, in)) float64, the backbone's update ``B A``. files (dict[str, str]): set -> prompt file.
        modules (list[str]): the modules whose inputs are captured. sketch (dict | None): the manifest's
            ``protection.inputs`` (``exact_width``, ``sketch_rows``); None: every Gram exact. info (dict | None):
            filled with ``{set: {module: {"rows", "bound"}}}`` for the sketched inputs.
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
    fd: dict = {}
    wide = int(sketch["exact_width"]) if sketch else None
    ell = int(sketch["sketch_rows"]) if sketch else 0
    n_rows = 0
    weights = {m: (torch.from_numpy(B).float(), torch.from_numpy(A).float()) for m, (B, A) in backbone.items()}

    def hook(m: str):
        def add(module, args, output):
            x = args[0]
            if m in modules:
                X = x.reshape(-1, x.shape[-1]).double().numpy()
                if wide is not None and X.shape[1] > wide and n_rows > 2 * ell:
                    fd.setdefault(m, _Sketch(X.shape[1], ell)).add(X)
                else:
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
                fd.clear()
                n_rows = sum(it.length for it in ps.items)
                for it in sorted(ps.items, key=lambda it: (-it.length, it.line)):  # the step's row order
                    model(input_ids=torch.tensor([list(it.prompt_ids + it.target_ids)]), use_cache=False)
                grams[k] = {m: rows[m] if m in rows else fd[m].gram() for m in modules if m in rows or m in fd}
                if info is not None and fd:
                    info[k] = {m: {"rows": f.n, "bound": f.delta / f.trace if f.trace > 0 else 0.0}
                               for m, f in fd.items()}
    finally:
        for h in handles:
            h.remove()
    return grams, sets
