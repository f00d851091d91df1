"""Loss aggregation in torch (verl `agg_loss` modes)."""
import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS


def aggregate(loss, mask, *, mode="seq-mean-token-mean", norm=None, empty_rows="exclude",
              group_size=None, group_ids=None):
    """Reduce a [B, T] per-token loss to a scalar; see ref_numpy.aggregate for the five modes
    (the fifth, a token mean per prompt then a mean over prompts, reads the rows' groups).

    Args/Returns: as ref_numpy.aggregate, with tensors (a 0-d tensor).
    """
    a = args.aggregate(OPS, loss, mask, mode, norm, empty_rows, group_size, group_ids)
    per_token, m = a.loss, a.mask
    if per_token.dim() == 1:
        per_token, m = per_token[None], m[None]
    kept = torch.where(m, per_token, tt.zero(per_token))
    lengths = m.sum(dim=-1)
    if a.mode == "prompt-mean-token-mean":
        B = per_token.shape[0]
        ids = torch.arange(B, device=per_token.device) // a.group_size \
            if a.group_size is not None else \
            torch.as_tensor(a.group_ids, device=per_token.device).reshape(-1)
        _, prompt = torch.unique(ids, return_inverse=True)
        P = int(prompt.max()) + 1 if B else 0
        sums = per_token.new_zeros(P).index_add(0, prompt, kept.sum(dim=-1))
        tokens = per_token.new_zeros(P).index_add(
            0, prompt, lengths.to(per_token.dtype))
        counted = int((tokens > 0).sum()) if a.empty_rows == "exclude" else P
        return (sums / torch.clamp(tokens, min=1)).sum() / max(counted, 1)
    n_rows = int((lengths > 0).sum()) if a.empty_rows == "exclude" else per_token.shape[0]
    n_rows = max(n_rows, 1)
    if a.mode == "token-mean":
        n_tokens = int(lengths.sum())
        return kept.sum() / n_tokens if n_tokens else kept.sum() * 0.0
    if a.mode == "seq-mean-token-mean":
        row_means = kept.sum(dim=-1) / torch.clamp(lengths, min=1).to(per_token.dtype)
        return row_means.sum() / n_rows
    if a.mode == "seq-mean-token-sum":
        rows = kept.sum(dim=-1).sum() / n_rows
        return rows if a.norm is None else rows / a.norm
    return kept.sum() / (per_token.shape[-1] if a.norm is None else a.norm)
