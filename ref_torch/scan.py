"""The reverse affine scan: the loop-free form of every backward recursion in ref_torch."""
import torch


def reverse_affine_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solve x_t = b_t + a_t·x_{t+1} (x_T = 0) along the last axis in ⌈log2 T⌉ doubling steps.

    Position t holds the composition of the affine maps f_t ∘ … ∘ f_{t+k−1} (f_s(y) = b_s + a_s·y)
    as (A, X): combining two adjacent windows gives X_t + A_t·X_{t+k} and A_t·A_{t+k}.
    """
    T = b.shape[-1]
    x, A, k = b, a, 1
    while k < T:
        x = x + A * torch.nn.functional.pad(x[..., k:], (0, k))
        A = A * torch.nn.functional.pad(A[..., k:], (0, k))
        k *= 2
    return x
