"""The per-token policy entropy in torch, H = −Σ p log p from log_softmax."""
import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS


def entropy(logits, mask=None):
    """H = −Σ_k p_k log p_k with log p = log_softmax(z), per token.
    Args/Returns: as ref_numpy.entropy, with tensors.
    """
    z, m = args.token_logits(OPS, logits, mask)
    z = torch.where(m[..., None], z, tt.zero(z))
    log_p = torch.log_softmax(z, dim=-1)
    live = z > -torch.inf                  # a −inf logit (vocabulary masking): 0·log 0 = 0
    log_p = torch.where(live, log_p, tt.zero(log_p))
    H = -torch.where(live, torch.exp(log_p) * log_p, tt.zero(log_p)).sum(dim=-1)
    return torch.where(m, H, tt.zero(H))
