"""Loss aggregation: the per-token weights that turn a [B, T] loss into the scalar a trainer
back-propagates, and their VJP (which *is* those weights)."""
import numpy as np

from ref_common import args

from . import _arrays as ar
from ._arrays import OPS
from .advantages import group_codes


def _weights(loss, mask, mode, norm, empty_rows, group_size=None, group_ids=None):
    a = args.aggregate(OPS, loss, mask, mode, norm, empty_rows, group_size, group_ids)
    mode, norm, empty_rows = a.mode, a.norm, a.empty_rows
    (lo, m), _ = ar.as_2d(a.loss, a.mask)
    mf = m.astype(np.float64)
    L = mf.sum(axis=1)                                   # tokens per row
    rows = float((L > 0).sum()) if empty_rows == "exclude" else float(m.shape[0])
    if mode == "prompt-mean-token-mean":
        gid = group_codes(m.shape[0], a.group_size, a.group_ids)
        tokens = np.bincount(gid, weights=L)             # tokens per prompt
        prompts = float((tokens > 0).sum()) if empty_rows == "exclude" else float(tokens.size)
        w = mf / np.maximum(tokens, 1.0)[gid][:, None] / max(prompts, 1.0)
    elif mode == "token-mean":
        N = mf.sum()
        w = mf / N if N > 0 else np.zeros_like(mf)
    elif mode == "seq-mean-token-mean":
        w = mf / np.maximum(L, 1.0)[:, None] / max(rows, 1.0)
    elif mode == "seq-mean-token-sum":
        w = mf / max(rows, 1.0) / (1.0 if norm is None else norm)
    else:
        norm = float(m.shape[1]) if norm is None else norm
        w = mf / norm
    return ar.zero_masked(lo, m), w


def aggregate(loss, mask, *, mode="seq-mean-token-mean", norm=None, empty_rows="exclude",
              group_size=None, group_ids=None):
    """Reduce a per-token loss to the scalar a trainer minimises.

        "token-mean":              Σ_bt m·l / Σ_bt m
        "seq-mean-token-mean":     mean over rows b of (Σ_t m·l / L_b)
        "seq-mean-token-sum":      mean over rows b of Σ_t m·l  (of Σ_t m·l / norm, norm given)
        "seq-mean-token-sum-norm": Σ_bt m·l / norm   (norm = T, the padded length, by default)
        "prompt-mean-token-mean":  mean over prompts p of (Σ_{b∈p,t} m·l / N_p), N_p the valid
                                   tokens of p's responses; the rows' prompts are group_size
                                   consecutive rows, or equal group_ids (SkyRL "prompt_mean")

    Reference: verl `agg_loss` (docs/conventions.md); Dr. GRPO, arXiv:2503.20783, §3.1 on
    the length bias of per-sequence means.
    Note: rows with no valid token: `empty_rows="exclude"` (verl, OpenRLHF) leaves them out of
    the row count; "include" (TRL `grpo`, MiniMind GRPO) counts them as rows contributing 0.
    An all-masked batch aggregates to 0. Under "prompt-mean-token-mean" empty_rows says the same
    of prompts none of whose responses has a valid token (SkyRL counts them: "include"). `seq-mean-token-sum-norm` divides by `norm` only,
    never by B (the Dr. GRPO form of verl at b178a3cd5). "seq-mean-token-sum" with a `norm`
    divides by both: TRL's `dr_grpo` (norm = max_completion_length, empty rows included) and
    verl 0.9's `seq-mean-token-sum-norm` (norm = its loss_scale_factor, empty rows excluded).

    Worked example, lengths 1 and 3, all losses 1: token-mean weights every token 1/4;
    seq-mean-token-mean gives the lone token 1/2 and each of the three 1/6 (length bias).
    Rows of lengths 1, 3 | 2 in two prompts: prompt-mean-token-mean weights the first prompt's
    four tokens 1/8 each and the second's two 1/4 each.

    Args:
      loss: [B, T] float (or [T]). Per-token loss; masked positions may hold anything.
      mask: [B, T] bool or 0/1 (required).
      mode: one of the five above.
      norm: float > 0, or None: for "seq-mean-token-sum-norm" (None: T) and
        "seq-mean-token-sum" (None: no further division).
      empty_rows: "exclude" | "include".
      group_size: int dividing B, or group_ids: [B] int: the rows' prompts, exactly one of the
        two for "prompt-mean-token-mean" (checked when given, read by that mode only).

    Returns:
      float64 scalar.
    """
    lo, w = _weights(loss, mask, mode, norm, empty_rows, group_size, group_ids)
    return np.float64((w * lo).sum())


def aggregate_vjp(g, loss, mask, *, mode="seq-mean-token-mean", norm=None, empty_rows="exclude",
                  group_size=None, group_ids=None):
    """VJP of `aggregate` wrt loss.

    Gradient:
      Every mode is linear in loss, J = Σ_bt w_bt·l_bt, so ∂J/∂l = w: token-mean w = m/N;
      seq-mean-token-mean w = m_bt/(L_b·B'); seq-mean-token-sum w = m/B' (m/(B'·norm));
      seq-mean-token-sum-norm w = m/norm; prompt-mean-token-mean w = m_bt/(N_p(b)·P'); B' and
      P' = the number of rows and prompts counted. The VJP is g·w.
      These weights are the length bias made visible: under seq-mean-token-mean a token of a
      short answer weighs more than a token of a long one.

    Returns:
      {"loss": [B, T]} float64 (the shape of `loss`).
    """
    g = args.scalar_cotangent(OPS, g, "aggregate")
    _, w = _weights(loss, mask, mode, norm, empty_rows, group_size, group_ids)
    return {"loss": (g * w).reshape(np.shape(loss))}
