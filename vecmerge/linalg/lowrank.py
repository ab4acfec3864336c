"""The factored term ``s * B @ A`` and its exact algebra, without ever forming the dense matrix.

Shapes: ``B`` is (out, r), ``A`` is (r, in); the update is ``scale * B @ A`` of shape (out, in).
All arithmetic runs in ``COMPUTE_DTYPE`` (float64): the factors are small, so the cost is nothing
next to reading them, and near-cancelling differences such as ``v51 - v28`` keep their digits.
The device is the factors' own: whoever reads them puts them there (``resolve_device`` names it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import AlignmentError, NumericError, VecmergeError

COMPUTE_DTYPE = torch.float64
# Exact rank: singular directions whose total is below this share of |s| ||B||_F ||A||_F (an upper
# bound on the terms' magnitude) are float64 round-off, not rank: x - x has rank 0, not noise.
EXACT_RTOL = 1e-9


def resolve_device(name) -> torch.device:
    """The torch device for ``name`` (``cpu``, ``cuda``, ``cuda:1``); a clear error if it is not usable.

    Args:
        name (str | torch.device): what the user asked for (``--device``).
    """
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise VecmergeError(f"--device {name}: not a device torch knows; use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise VecmergeError(f"--device {name}: vecmerge runs on cpu or cuda; use one of those")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VecmergeError(f"--device {name}: no CUDA device is visible to torch; use --device cpu")
    if dev.type == "cuda":
        # torch loads its CUDA linear algebra lazily, and that first load fails when it happens on two worker
        # threads at once ("lazy wrapper should be called at most once", pytorch/pytorch#90613): load it here,
        # on the calling thread, before kernels.map_modules spreads modules over threads.
        torch.linalg.qr(torch.eye(2, dtype=torch.float64, device=dev))
    return dev


# Every core and update stays within these magnitudes, so that squares, norms and inner products of
# it neither overflow nor underflow float64 (whose range is 2.2e-308 .. 1.8e308).
SAFE_MAX, SAFE_MIN = 1e150, 1e-150


def max_abs(t: torch.Tensor) -> float:
    """``max |t|`` (0.0 for an empty tensor; NaN when t holds a NaN): one pass, no ``abs`` copy."""
    if not t.numel():
        return 0.0
    lo, hi = (float(v) for v in torch.aminmax(t))
    return hi if hi != hi else max(-lo, hi)  # NaN makes both NaN


def magnitude(x) -> float:
    """The size of ``x``'s entries: the largest of a tensor, ``|s| max|B| max|A|`` for a LowRank, ``|x|``
    for a number."""
    if isinstance(x, LowRank):
        if x.rank == 0 or x.scale == 0.0:
            return 0.0
        return abs(x.scale) * max_abs(x.B) * max_abs(x.A)
    if isinstance(x, torch.Tensor):
        return max_abs(x)
    return abs(float(x))


def check_magnitude(module: str, what: str, x, fix: str) -> None:
    """NumericError unless ``x`` (a tensor, a LowRank or a number) is finite and its size is 0 or in
    [SAFE_MIN, SAFE_MAX]: no module's numbers may silently overflow to inf/NaN or underflow to zero.

    Args:
        module (str): for the message. what (str): the quantity (``"base (1e300*v28)"``).
        x (Tensor | LowRank | float): a core, an update or a norm of the module. fix (str): what to change.
    """
    size = magnitude(x)  # a NaN entry makes the max NaN: the one reduction also finds non-finite entries
    if not math.isfinite(size):
        problem = "is not finite (it overflows float64 or holds NaN)"
    elif size > SAFE_MAX:
        problem = f"reaches {size:.3g}, too large for float64 norms and products (at most {SAFE_MAX:g})"
    elif 0.0 < size < SAFE_MIN:
        problem = f"is at most {size:.3g}, too small for float64 norms and products (at least {SAFE_MIN:g})"
    else:
        return
    raise NumericError(f"module {module}: {what} {problem}; {fix}")


def f64(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the compute dtype (float64), on its own device."""
    return t.to(dtype=COMPUTE_DTYPE)


@dataclass(frozen=True)
class Core:
    """An orthonormal sandwich ``Qb @ C @ Qa.T`` equal to a LowRank's update.

    Args:
        Qb (Tensor): (out, p) with orthonormal columns.
        C (Tensor): (p, q), the small core.
        Qa (Tensor): (in, q) with orthonormal columns.
    """

    Qb: torch.Tensor
    C: torch.Tensor
    Qa: torch.Tensor


@dataclass(frozen=True)
class SVD:
    """Thin SVD of a LowRank: update ``= U @ diag(S) @ Vh``, S descending.

    Args:
        U (Tensor): (out, k). S (Tensor): (k,). Vh (Tensor): (k, in).
        floor (float): ``|s| ||B||_F ||A||_F`` of the factors it came from, the round-off scale.
    """

    U: torch.Tensor
    S: torch.Tensor
    Vh: torch.Tensor
    floor: float = 0.0

    def exact_rank(self, rtol: float = EXACT_RTOL) -> int:
        """Smallest k whose cut error ``sqrt(sum_{i>=k} S_i^2)`` is at most ``rtol * max(||S||, floor)``."""
        return rank_for_error(self.S, rtol, self.floor)

    def energy_rank(self, energy: float) -> int:
        """Smallest k with ``sum_{i<k} S_i^2 >= energy * sum S_i^2`` (``energy_rank``)."""
        return energy_rank(self.S, energy)

    def dropped_error(self, k: int) -> float:
        """Frobenius error of the best rank-k cut: ``sqrt(sum_{i>=k} S_i^2)`` (Eckart-Young)."""
        return float(torch.sqrt((self.S[k:] ** 2).sum()))

    def truncate(self, k: int) -> LowRank:
        """The optimal rank-k approximation, split evenly: ``B = U_k sqrt(S_k)``, ``A = sqrt(S_k) Vh_k``."""
        root = torch.sqrt(self.S[:k])
        return LowRank(self.U[:, :k] * root, root[:, None] * self.Vh[:k], 1.0)


def energy_rank(S: torch.Tensor, energy: float) -> int:
    """Smallest k with ``sum_{i<k} S_i^2 >= energy * sum S_i^2`` (0 for a zero update).

    Args:
        S (Tensor): (k,) singular values, descending. energy (float): the share to keep, in (0, 1].
    """
    total = float((S**2).sum())
    if total == 0.0:
        return 0
    cum = torch.cumsum(S**2, 0) / total
    return int((cum < energy - 1e-15).sum().item()) + 1


def rank_for_error(S: torch.Tensor, rtol: float, ref: float = 0.0) -> int:
    """Smallest k with ``sqrt(sum_{i>=k} S_i^2) <= rtol * max(||S||, ref)``.

    Args:
        S (Tensor): (k,) singular values, descending.
        rtol (float): allowed relative Frobenius error.
        ref (float): a larger scale to measure against (round-off of a cancelling sum).
    """
    total = max(float((S**2).sum()), ref * ref)
    if total == 0.0:
        return 0
    tail = torch.flip(torch.cumsum(torch.flip(S**2, [0]), 0), [0])  # tail[i] = sum_{j>=i} S_j^2
    return int((tail > (rtol**2) * total).sum())  # tail is non-increasing


@dataclass(frozen=True)
class LowRank:
    """One module's update ``scale * B @ A``, kept factored.

    Args:
        B (Tensor): (out, r) left factor.
        A (Tensor): (r, in) right factor.
        scale (float): the PEFT scale ``lora_alpha / r`` (or ``/ sqrt(r)`` for rsLoRA).
    """

    B: torch.Tensor
    A: torch.Tensor
    scale: float = 1.0

    def __post_init__(self):
        if self.B.ndim != 2 or self.A.ndim != 2 or self.B.shape[1] != self.A.shape[0]:
            raise AlignmentError(
                f"factor shapes disagree: B {tuple(self.B.shape)} and A {tuple(self.A.shape)}; "
                "expected B (out, r) and A (r, in)"
            )

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the update."""
        return (int(self.B.shape[0]), int(self.A.shape[1]))

    @property
    def rank(self) -> int:
        """Stored rank r (an upper bound on the numerical rank)."""
        return int(self.A.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the factors live."""
        return self.B.device

    @classmethod
    def zeros(cls, shape: tuple[int, int], device=None) -> LowRank:
        """The zero update of shape (out, in), with rank 0, on ``device`` (default cpu)."""
        return cls(torch.zeros(shape[0], 0, dtype=COMPUTE_DTYPE, device=device),
                   torch.zeros(0, shape[1], dtype=COMPUTE_DTYPE, device=device), 1.0)

    def dense(self) -> torch.Tensor:
        """``scale * B @ A`` as a dense (out, in) matrix. For tests and small checks only."""
        return self.scale * (f64(self.B) @ f64(self.A))

    # -- linear algebra ---------------------------------------------------------------------
    def __mul__(self, c: float) -> LowRank:
        return LowRank(self.B, self.A, self.scale * float(c))

    __rmul__ = __mul__

    def __neg__(self) -> LowRank:
        return self * -1.0

    def __add__(self, other: LowRank) -> LowRank:
        return combine([(1.0, self), (1.0, other)])

    def __sub__(self, other: LowRank) -> LowRank:
        return combine([(1.0, self), (-1.0, other)])

    def inner(self, other: LowRank) -> float:
        """Frobenius inner product ``<s1 B1 A1, s2 B2 A2> = s1 s2 sum((B1^T B2) * (A1 A2^T))``.

        Cost O((out + in) r1 r2); no dense matrix.
        """
        _check_same_shape(self, other)
        B1, A1, B2, A2 = (f64(t) for t in (self.B, self.A, other.B, other.A))
        return float(self.scale * other.scale * ((B1.T @ B2) * (A1 @ A2.T)).sum())

    def core(self) -> Core:
        """QR of both factors: ``s B A = Qb (s Rb Ra^T) Qa^T``. Cost O((out + in) r^2)."""
        B, A = f64(self.B), f64(self.A)
        Qb, Rb = torch.linalg.qr(B)
        Qa, Ra = torch.linalg.qr(A.T)
        return Core(Qb, self.scale * (Rb @ Ra.T), Qa)

    def norm(self) -> float:
        """Frobenius norm ``||s B A||_F = |s| ||Rb Ra^T||_F``; stable for near-cancelling sums."""
        if self.rank == 0 or self.scale == 0.0:
            return 0.0
        Rb = torch.linalg.qr(f64(self.B), mode="r").R  # R factors only: the bases are not needed
        Ra = torch.linalg.qr(f64(self.A).T, mode="r").R
        return abs(self.scale) * float(torch.linalg.matrix_norm(Rb @ Ra.T))

    def singular_values(self) -> torch.Tensor:
        """Singular values from the R factors only: ``B = Qb Rb, A^T = Qa Ra`` => ``sigma(|s| Rb Ra^T)``.

        Returns (min(r, out, in),) float64 on the CPU, descending (empty for a zero update).
        """
        if self.rank == 0 or self.scale == 0.0:
            return torch.zeros(0, dtype=COMPUTE_DTYPE)
        Rb = torch.linalg.qr(f64(self.B), mode="r").R
        Ra = torch.linalg.qr(f64(self.A).T, mode="r").R
        return torch.linalg.svdvals(abs(self.scale) * (Rb @ Ra.T)).cpu()

    def cosine(self, other: LowRank) -> float:
        """``<x, y> / (||x|| ||y||)``; 0.0 where either is zero."""
        nx, ny = self.norm(), other.norm()
        if nx == 0.0 or ny == 0.0:
            return 0.0
        return self.inner(other) / (nx * ny)

    def svd(self) -> SVD:
        """Thin SVD via the small core: ``C = U S V^T``, then ``U' = Qb U``, ``Vh' = V^T Qa^T``."""
        out, inn = self.shape
        if self.rank == 0:
            z = LowRank.zeros((out, inn), self.device)
            return SVD(z.B, torch.zeros(0, dtype=COMPUTE_DTYPE, device=self.device), z.A)
        c = self.core()
        U, S, Vh = torch.linalg.svd(c.C, full_matrices=False)
        floor = abs(self.scale) * float(torch.linalg.norm(f64(self.B))) * float(torch.linalg.norm(f64(self.A)))
        return SVD(c.Qb @ U, S, Vh @ c.Qa.T, floor)


def _check_same_shape(x: LowRank, y: LowRank) -> None:
    if x.shape != y.shape:
        raise AlignmentError(f"update shapes differ: {x.shape} and {y.shape}; adapters of different base models?")


def combine(terms: list[tuple[float, LowRank]]) -> LowRank:
    """Exact linear combination by stacking: ``sum c_i s_i B_i A_i = [c_i s_i B_i] @ [A_i]``.

    Args:
        terms (list[tuple[float, LowRank]]): coefficients and terms, all of one shape (out, in).

    Returns:
        LowRank of rank ``sum r_i`` with scale 1, in float64.
    """
    if not terms:
        raise ValueError("combine() needs at least one term")
    first = terms[0][1]
    for _, t in terms[1:]:
        _check_same_shape(first, t)
    live = [(c, t) for c, t in terms if c != 0.0 and t.scale != 0.0 and t.rank > 0]
    if not live:
        return LowRank.zeros(first.shape, first.device)
    Bs = torch.cat([(c * t.scale) * f64(t.B) for c, t in live], dim=1)
    As = torch.cat([f64(t.A) for _, t in live], dim=0)
    return LowRank(Bs, As, 1.0)



def relative_error(x: LowRank, ref: LowRank) -> float:
    """``||x - ref|| / ||ref||`` (absolute error when ref is zero), in factored form."""
    err = (x - ref).norm()
    n = ref.norm()
    return err / n if n > 0 else err

