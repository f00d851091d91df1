"""A torch twin of CISPO with its stop-gradient removed: a planted bug for the cross-check.

The value is CISPO's; the gradient differentiates the weight w = clip(ratio) too, the classic
missing .detach(). The value stage cannot see it; the vjp and detach stages name it. Used by
tests/check/test_stages.py and shown in docs/check.md:

    python scripts/render_examples.py    # regenerates docs/check.md's failure paragraphs
"""
import torch

import ref_torch


def cispo_without_detach(logp, old_logp, advantages, mask=None, *, clip_high=5.0, clip_low=None,
                         bound="absolute", log_ratio_clamp=None):
    """Same value as CISPO, but the weight w is differentiated: the classic missing .detach()."""
    out = ref_torch.cispo_loss(logp, old_logp, advantages, mask, clip_high=clip_high,
                               clip_low=clip_low, bound=bound, log_ratio_clamp=log_ratio_clamp)
    m = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask.bool()
    A = advantages if advantages.shape == logp.shape else advantages[:, None].expand(logp.shape)
    zero = torch.zeros((), dtype=logp.dtype)
    lp, A = torch.where(m, logp, zero), torch.where(m, A, zero)
    rho = torch.where(m, logp - old_logp, zero)
    if log_ratio_clamp is not None:
        rho = torch.clamp(rho, -log_ratio_clamp, log_ratio_clamp)
    r = torch.exp(rho)
    if bound == "absolute":
        w = torch.clamp(r, max=clip_high)
    else:
        w = torch.clamp(r, min=0.0 if clip_low is None else max(1 - clip_low, 0.0),
                        max=1 + clip_high)
    return out + torch.where(m, -(w - w.detach()) * A * lp, zero)
