"""Loss aggregation in torch (verl `agg_loss` modes)."""
import torch

from ref_numpy import _checks

from . import _tensors as tt


def aggregate(loss, mask, *, mode="seq-mean-token-mean", norm=None, empty_rows="exclude"):
    """Reduce a [B, T] per-token loss to a scalar; see ref_numpy.aggregate for the four modes.

    Args/Returns: as ref_numpy.aggregate, with tensors (a 0-d tensor).
    """
    per_token = tt.token("loss", loss)
    _checks.policy_mask(mask is None, "aggregate")
    m = tt.mask_of(mask, "loss", per_token)
    mode = _checks.choice("mode", mode, _checks.AGG_MODES)
    empty_rows = _checks.choice("empty_rows", empty_rows, _checks.EMPTY_ROWS)
    _checks.agg_norm(norm, mode)
    tt.finite_at_valid("loss", per_token, m)
    if per_token.dim() == 1:
        per_token, m = per_token[None], m[None]
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    kept = torch.where(m, per_token, zero)
    lengths = m.sum(dim=-1)
    n_rows = int((lengths > 0).sum()) if empty_rows == "exclude" else per_token.shape[0]
    n_rows = max(n_rows, 1)
    if mode == "token-mean":
        n_tokens = int(lengths.sum())
        return kept.sum() / n_tokens if n_tokens else kept.sum() * 0.0
    if mode == "seq-mean-token-mean":
        row_means = kept.sum(dim=-1) / torch.clamp(lengths, min=1).to(per_token.dtype)
        return row_means.sum() / n_rows
    if mode == "seq-mean-token-sum":
        return kept.sum(dim=-1).sum() / n_rows
    denom = per_token.shape[-1] if norm is None else _checks.positive("norm", norm)
    return kept.sum() / denom
