"""Planted bugs in the newer loss families, written as a trainer would (torch, [B] or [B, T]
advantages): a missing stop-gradient (DPPO's truncated ratio, VESPO's φ), DPPO's binary KL
with its arguments swapped, SAPO with its two temperatures swapped."""
import torch
def dppo_undetached(logp, old_logp, advantages, mask):
    a = advantages if advantages.dim() == 2 else advantages[:, None]
    w = torch.clamp(torch.exp(torch.clamp(logp - old_logp, -20, 20)), max=3.0)   # not detached
    p, q = logp.exp(), old_logp.exp()
    keep = torch.where(a > 0, p - q <= 0.2, p - q >= -0.2) & mask.bool()
    return torch.where(keep, -a * w * logp, torch.zeros_like(logp))
def vespo_undetached(logp, old_logp, advantages, mask):
    import math
    a = advantages if advantages.dim() == 2 else advantages[:, None]
    m = mask.to(logp.dtype)
    lw = torch.clamp((torch.clamp(logp - old_logp, -20, 20) * m).sum(-1, keepdim=True), math.log(1e-8), 20)
    k = torch.where(a >= 0, 2.0, 3.0); lam = torch.where(a >= 0, 3.0, 2.0)
    phi = torch.exp(lam + k * lw - lam * torch.exp(lw))       # not detached
    return torch.where(mask.bool(), -phi * a * logp, torch.zeros_like(logp))
def dppo_kl_swapped(logp, old_logp, advantages, mask):
    a = advantages if advantages.dim() == 2 else advantages[:, None]
    w = torch.clamp(torch.exp(torch.clamp(logp - old_logp, -20, 20)), max=3.0).detach()
    p, q = logp.exp().detach(), old_logp.exp()
    d = p * (logp.detach() - old_logp) + (1 - p) * (torch.log(1 - p + 1e-8) - torch.log(1 - q + 1e-8))   # swapped
    keep = torch.where(a > 0, (d <= 0.2) | (p <= q), (d <= 0.2) | (p >= q)) & mask.bool()
    return torch.where(keep, -a * w * logp, torch.zeros_like(logp))
def sapo_swapped(logp, old_logp, advantages, mask):
    a = advantages if advantages.dim() == 2 else advantages[:, None]
    r = torch.exp(logp - old_logp)
    tau = torch.where(a > 0, 1.05, 1.0)      # swapped
    return torch.where(mask.bool(), -a * torch.sigmoid(tau * (r - 1)) * 4 / tau, torch.zeros_like(logp))
