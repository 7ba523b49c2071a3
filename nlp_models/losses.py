"""Similarity measures used as training losses.

Linear CKA (Kornblith et al., 2019), as FedMCP Eqs. 6-7 define it for two batches of
representations X, Y in R^{n x h}:

    K = X X^T,  L = Y Y^T,  H = I - (1/n) 1 1^T
    HSIC(K, L) = tr(K H L H) / (n - 1)^2                                   (Eq. 7)
    CKA(X, Y)  = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))                   (Eq. 6)

HKH = Xc Xc^T with Xc the column-centred X, so tr(KHLH) = sum(Xc Xc^T * Yc Yc^T): an n x n Gram
product, cheap for training batches (n <= 64) whatever the hidden size. CKA lies in [0, 1], is 1 for
identical inputs and is invariant to orthogonal transforms and isotropic scaling of either input.
"""
from __future__ import annotations

import torch


def centered_gram(x: torch.Tensor) -> torch.Tensor:
    """H (X X^T) H for a batch X of shape (n, h): the Gram matrix of the column-centred rows."""
    if x.dim() != 2:
        raise ValueError(f"expected an (n, h) batch of representations, got shape {tuple(x.shape)}")
    centred = x - x.mean(dim=0, keepdim=True)
    return centred @ centred.T


def hsic(k_centred: torch.Tensor, l_centred: torch.Tensor) -> torch.Tensor:
    """HSIC(K, L) = tr(K H L H) / (n-1)^2 from centred Gram matrices HKH and HLH (Eq. 7)."""
    n = k_centred.shape[0]
    if k_centred.shape != l_centred.shape or k_centred.shape != (n, n):
        raise ValueError(f"Gram matrices must both be (n, n), got {tuple(k_centred.shape)} and {tuple(l_centred.shape)}")
    if n < 2:
        raise ValueError("HSIC needs at least two examples")
    # tr(HKH HLH) = tr(KHLH) because H is idempotent; both matrices are symmetric.
    return (k_centred * l_centred).sum() / (n - 1) ** 2


def linear_cka(x: torch.Tensor, y: torch.Tensor, *, eps: float = 1e-12) -> torch.Tensor:
    """CKA(X, Y) with linear kernels (Eq. 6), differentiable in both arguments.

    ``eps`` keeps the denominator (and the gradient of its square root) finite when a batch of
    representations is constant, where CKA is undefined; such a batch then scores 0.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"X and Y need the same number of rows, got {x.shape[0]} and {y.shape[0]}")
    dtype = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)  # float64 stays (gradcheck)
    k, l = centered_gram(x.to(dtype)), centered_gram(y.to(dtype))
    cross = hsic(k, l)
    scale = torch.sqrt((hsic(k, k) * hsic(l, l)).clamp_min(eps))
    return cross / scale
