"""``Stack``: an update ``B @ A`` held as stacked float64 factors, for verify's own derivation (numpy only).

Inner products come from Grams (``<X, Y> = sum((B_x^T B_y) * (A_x A_y^T))``), norms too where nothing cancels
and from R factors (``||R_b R_a^T||``) where a difference nearly cancels (``Stack.norm``). A dense matrix D is
the Stack ``(D, I)`` (or ``(I, D)`` when it is wider than tall: ``dense``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np

ZERO_RTOL = 1e-9      # a module whose norm is below this share of its terms' norms is zero (it has no sign)
GRAM_FLOOR = 1e-6     # a norm from the Grams only where ||X||^2 >= this share of bound^2, else from R factors


@dataclass
class Stack:
    """``B @ A`` held as stacked float64 factors; ``bound = sum_i ||B_i|| ||A_i||`` of its terms (for ZERO_RTOL)."""

    B: np.ndarray
    A: np.ndarray
    bound: float = 0.0

    @classmethod
    def zero(cls, out: int, inn: int) -> Stack:
        return cls(np.zeros((out, 0)), np.zeros((0, inn)))

    def __add__(self, o: Stack) -> Stack:
        return Stack(np.hstack([self.B, o.B]), np.vstack([self.A, o.A]), self.bound + o.bound)

    def scaled(self, c: float) -> Stack:
        return Stack(self.B * c, self.A, self.bound * abs(c))

    def inner(self, o: Stack) -> float:
        """``<self, o>_F`` from the two Grams."""
        if not self.B.shape[1] or not o.B.shape[1]:
            return 0.0
        return float(np.sum((self.B.T @ o.B) * (self.A @ o.A.T)))

    def norm(self) -> float:
        """``||B A||_F``: from the Grams, ``sqrt(sum((B^T B) * (A A^T)))``, whose error is about ``eps * bound^2``,
        so it is taken only where ``||B A||^2 >= GRAM_FLOOR * bound^2`` (relative error <= 1e-10); below, where the
        terms nearly cancel (``v - v``), from R factors, ``||R_b R_a^T||_F``, stable at any size."""
        if not self.B.shape[1]:
            return 0.0
        gram = float(np.sum((self.B.T @ self.B) * (self.A @ self.A.T)))
        if gram >= GRAM_FLOOR * self.bound * self.bound > 0.0:
            return math.sqrt(gram)
        return float(np.linalg.norm(r_factor(self.B) @ r_factor(self.A.T).T))

    def is_zero(self) -> bool:
        return self.norm() <= ZERO_RTOL * self.bound

    def apply(self, X: np.ndarray) -> np.ndarray:
        """``B (A X)``."""
        return self.B @ (self.A @ X)

    def singular_values(self) -> np.ndarray:
        """The singular values of ``B @ A``: from the R factors, ``svd(R_b R_a^T)``, or from the dense matrix where the
        stack is as wide as the matrix (a dense-space merge: no larger, and no QR of an identity)."""
        if not self.B.shape[1]:
            return np.zeros(0)
        if self.B.shape[1] >= min(self.B.shape[0], self.A.shape[1]):
            return np.linalg.svd(self.B @ self.A, compute_uv=False)
        return np.linalg.svd(r_factor(self.B) @ r_factor(self.A.T).T, compute_uv=False)

    def dense(self) -> np.ndarray:
        """``B @ A`` as one (out, in) matrix (a module at a time)."""
        return self.B @ self.A


def r_factor(M: np.ndarray) -> np.ndarray:
    """R of the thin QR of M (``M = Q R``; ``||M x|| = ||R x||``)."""
    return cast(np.ndarray, np.linalg.qr(M, mode="r"))


def dense(D: np.ndarray) -> Stack:
    """The dense (out, in) matrix D as a Stack of width ``min(out, in)``; its bound is ``||D||_F``."""
    out, inn = D.shape
    nrm = float(np.linalg.norm(D))
    return Stack(D, np.eye(inn), nrm) if inn <= out else Stack(np.eye(out), D, nrm)
