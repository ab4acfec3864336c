"""One module input's rows on one prompt set, held in the cheapest form that answers a protected step.

    rows      ``X`` (n, in) float32 copies while ``n <= in``: nothing is computed during the forward pass, and
              ``X^T X``'s eigenvectors are ``X``'s right singular vectors (float64 SVD after the forward): exact
    gram      ``G = X^T X`` (in, in) float64 once ``n > in``, for inputs up to ``EXACT_WIDTH`` wide: exact
    sketch    for inputs wider than ``EXACT_WIDTH`` once ``n > 2 l``: a Frequent Directions sketch ``B`` (l, in)
              float64 (Liberty 2013; Ghashami et al. 2016), ``0 <= X^T X - B^T B <= delta I`` with ``delta`` the
              summed shrinkage, recorded (``bound``: ``delta / tr(X^T X)``)

``factor()`` is ``F`` with ``F^T F = G`` (rows, sketch) or None (gram); ``gram()`` forms ``G`` in float64.
Rows are taken in the order they are added, so a sketch is reproducible from the same row order.
"""

from __future__ import annotations

import torch

EXACT_WIDTH = 4096  # inputs up to this width are held exactly (rows, then a float64 Gram: 128 MiB at 4096)
SKETCH_ROWS = 512  # l: a wider input's sketch rows; its first 2 l rows are kept exactly


class Inputs:
    """The rows of one module input on one prompt set: exact rows, an exact float64 Gram, or a sketch.

    Args:
        width (int): the input's width ``in``. sketch_rows (int): ``l`` for inputs wider than ``exact_width``.
        exact_width (int): the widest input held exactly. row_limit (int | None): rows kept before switching
            (default ``in``, or ``2 l`` for a wide input; 0 forms the Gram from the first rows, as before).
    """

    def __init__(self, width: int, *, sketch_rows: int = SKETCH_ROWS, exact_width: int = EXACT_WIDTH,
                 row_limit: int | None = None):
        self.width, self.sketch_rows = int(width), int(sketch_rows)
        self.wide = self.width > exact_width
        self.limit = (2 * self.sketch_rows if self.wide else self.width) if row_limit is None else int(row_limit)
        self.n, self.trace, self.delta = 0, 0.0, 0.0
        self._chunks: list[torch.Tensor] = []
        self._X: torch.Tensor | None = None
        self.G: torch.Tensor | None = None
        self.B: torch.Tensor | None = None
        self._fill = 0

    @property
    def kind(self) -> str:
        """``"rows"``, ``"gram"`` or ``"sketch"``."""
        return "gram" if self.G is not None else "sketch" if self.B is not None else "rows"

    @property
    def bound(self) -> float:
        """``delta / tr(X^T X)``: the sketch's spectral error bound as a share of the trace (0 when exact)."""
        return self.delta / self.trace if self.trace > 0 else 0.0

    def nbytes(self) -> int:
        """The memory held (rows, Gram or sketch buffer)."""
        held = [*self._chunks, self._X, self.G, self.B]
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def add(self, rows: torch.Tensor) -> None:
        """Take ``rows`` (n_b, in) (a copy the caller no longer uses), in order."""
        rows = rows.reshape(-1, self.width)
        self.n += rows.shape[0]
        self.trace += float(torch.linalg.vector_norm(rows, dtype=torch.float64) ** 2)
        if self.kind == "rows":
            self._chunks.append(rows.to(torch.float32))
            if self.n <= self.limit:
                return
            X = self._rows64()
            self._X = None
            if self.wide:
                self.B = torch.zeros(2 * self.sketch_rows, self.width, dtype=torch.float64)
                self._sketch(X)
            else:
                self.G = X.T @ X
            return
        r64 = rows.to(torch.float64)
        if self.G is not None:
            self.G.addmm_(r64.T, r64)
        else:
            self._sketch(r64)

    def _sketch(self, R: torch.Tensor) -> None:
        """Frequent Directions: fill the 2 l buffer row by row; when full, shrink it to l rows."""
        i, size = 0, 2 * self.sketch_rows
        while i < R.shape[0]:
            k = min(size - self._fill, R.shape[0] - i)
            self.B[self._fill:self._fill + k] = R[i:i + k]  # type: ignore[index]
            self._fill, i = self._fill + k, i + k
            if self._fill == size:
                self._shrink(self.B)

    def _shrink(self, B) -> None:
        """``B <- sqrt(max(S^2 - s_l^2, 0)) V^T`` (top l rows), ``delta += s_l^2``: ``0 <= X^T X - B^T B <= delta``."""
        ell = self.sketch_rows
        w, P = torch.linalg.eigh(B @ B.T)  # B B^T = P diag(w) P^T, so B's right singular vectors are P^T B / sqrt(w)
        w, P = w.flip(0).clamp_min(0.0), P.flip(1)
        d = float(w[ell])
        top = w[:ell]
        keep = torch.sqrt((top - d).clamp_min(0.0) / top.clamp_min(1e-300))
        scale = torch.where(top > 0, keep, torch.zeros_like(top))
        B[:ell] = (P[:, :ell] * scale).T @ B
        B[ell:] = 0.0
        self._fill, self.delta = ell, self.delta + d

    def factor(self) -> torch.Tensor | None:
        """``F`` (float64) with ``F^T F = X^T X`` (rows) or ``B^T B`` (sketch); None when held as a Gram."""
        if self.kind == "gram":
            return None
        if self.kind == "sketch":
            return self.B[:self._fill]  # type: ignore[index]
        return self._rows64()

    def _rows64(self) -> torch.Tensor:
        """The kept rows (n, in) in float64 (their chunks joined once)."""
        if self._chunks:
            self._X = torch.cat([self._X, *self._chunks]) if self._X is not None else torch.cat(self._chunks)
            self._chunks = []
        X = self._X if self._X is not None else torch.zeros(0, self.width)
        return X.to(torch.float64)

    def gram(self) -> torch.Tensor:
        """``X^T X`` (or the sketch's ``B^T B``), (in, in) float64."""
        F = self.factor()
        return F.T @ F if F is not None else self.G  # type: ignore[return-value]

    def describe(self) -> dict:
        """What the manifest records: the form held, the rows read and, for a sketch, ``l`` and its bound."""
        out: dict = {"form": self.kind, "rows": self.n, "width": self.width}
        if self.kind == "sketch":
            out.update(sketch_rows=self.sketch_rows, bound=self.bound)
        return out
