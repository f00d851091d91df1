"""A corpus of correct trainer-style implementations (torch, masks multiplied in, written as
trainers write them, not by calling ref_torch), the profiles they conform under, and the helpers
the audit tests share."""
import sys

import torch

from tests.helpers import EXAMPLES

sys.path.insert(0, EXAMPLES)
import buggy  # noqa: E402,F401  (the planted bugs, for the tests)
import minimind_style  # noqa: E402
import trl_style  # noqa: E402
import verl_style  # noqa: E402

SEEDS = (0, 1)


N = 30


def failing(report):
    return {f.check for f in report.failures}


def finding(report, check):
    return next(f for f in report.findings if f.check == check)


# ================================================================ correct implementations
def grpo(ddof, eps, alone="zero"):
    """Group advantages, a loop over the groups; a group of one gets 0 ("zero") or, as verl's
    grpo does, mean 0 and std 1 ("keep")."""
    def fn(rewards, group_ids, valid=None):
        out = torch.zeros_like(rewards)
        keep = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
        for g in torch.unique(group_ids[keep]):
            idx = (group_ids == g) & keep
            r = rewards[idx]
            if r.numel() > 1:
                out[idx] = (r - r.mean()) / (r.std(unbiased=bool(ddof)) + eps)
            elif alone == "keep":
                out[idx] = r / (1.0 + eps)
        return out
    return fn


def whiten(ddof, eps, mode):
    def fn(x, mask):
        m = mask.to(x.dtype)
        n = m.sum()
        xm = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype))
        mean = (xm * m).sum() / n
        var = (((xm - mean) * m) ** 2).sum() / (n - ddof)
        if mode == "var":
            out = (xm - mean) * torch.rsqrt(var + eps)
        elif mode == "clamp":
            out = (xm - mean) * torch.rsqrt(torch.clamp(var, min=eps))
        else:
            out = (xm - mean) / (torch.sqrt(var) + eps)
        return out * m
    return fn


def ppo(lo=0.2, hi=0.2, c=None, clamp=None):
    def fn(logp, old_logp, advantages, mask):
        m = mask.bool()
        zero = torch.zeros((), dtype=logp.dtype)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        A = torch.where(m, A, zero)
        lr = torch.where(m, logp - old_logp, zero)
        if clamp:
            lr = torch.clamp(lr, -clamp, clamp)
        ratio = torch.exp(lr)
        loss1, loss2 = -A * ratio, -A * torch.clamp(ratio, 1 - lo, 1 + hi)
        loss = torch.maximum(loss1, loss2)
        if c is not None:
            loss = torch.where(A < 0, torch.minimum(loss, -A * c), loss)
        return loss * m
    return fn


def kl(kind, clamp_in=None, clamp_out=None):
    def fn(logp, ref_logp, mask):
        m = mask.bool()
        zero = torch.zeros((), dtype=logp.dtype)
        x = torch.where(m, ref_logp - logp, zero)
        if clamp_in:
            x = torch.clamp(x, -clamp_in, clamp_in)
        k = {"k1": -x, "k2": 0.5 * x ** 2, "k3": torch.exp(x) - x - 1}[kind]
        if clamp_out:
            k = torch.clamp(k, -clamp_out, clamp_out)
        return k * m
    return fn


def value_loss(clip):
    def fn(values, old_values, returns, mask):
        m = mask.to(values.dtype)
        zero = torch.zeros((), dtype=values.dtype)
        v, vo, R = (torch.where(mask.bool(), t, zero) for t in (values, old_values, returns))
        clipped = vo + torch.clamp(v - vo, -clip, clip)
        return 0.5 * torch.maximum((v - R) ** 2, (clipped - R) ** 2) * m
    return fn


def gae_loop(gamma, lam):
    def fn(rewards, values, mask, dones=None, last_value=None):
        B, T = rewards.shape
        m = mask.to(rewards.dtype)
        d = torch.zeros_like(rewards) if dones is None else dones.to(rewards.dtype)
        nextvalue = torch.zeros(B, dtype=rewards.dtype) if last_value is None else last_value
        lastgaelam = torch.zeros(B, dtype=rewards.dtype)
        out = []
        zero = torch.zeros((), dtype=rewards.dtype)
        r = torch.where(mask.bool(), rewards, zero)
        v = torch.where(mask.bool(), values, zero)
        for t in reversed(range(T)):
            delta = r[:, t] + gamma * (1 - d[:, t]) * nextvalue - v[:, t]
            new = delta + gamma * lam * (1 - d[:, t]) * lastgaelam
            lastgaelam = new * m[:, t] + (1 - m[:, t]) * lastgaelam
            nextvalue = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalue
            out.append(lastgaelam)
        adv = torch.stack(out[::-1], dim=1) * m
        return adv, (adv + v) * m
    return fn


def global_token_mean(loss, mask, n_tokens_global=None):
    m = mask.to(loss.dtype)
    n = int(mask.sum()) if n_tokens_global is None else n_tokens_global
    return (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum() / max(n, 1)


def seq_mean_all_rows(loss, mask):
    m = mask.to(loss.dtype)
    rows = (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum(1)
    return (rows / m.sum(1).clamp(min=1)).mean()


CORRECT = [
    ("verl", "group_advantages", grpo(1, 1e-6, alone="keep"), {}),
    ("trl", "group_advantages", grpo(1, 1e-4), {}),
    ("openrlhf", "group_advantages", grpo(1, 1e-9), {}),
    ("minimind", "group_advantages", grpo(0, 1e-4), {}),
    ("verl", "whiten", whiten(1, 1e-8, "var"), {}),
    ("openrlhf", "whiten", whiten(0, 1e-8, "clamp"), {}),
    ("minimind", "whiten", whiten(0, 1e-8, "var"), {}),
    ("cleanrl", "whiten", whiten(1, 1e-8, "std"), {}),
    ("verl", "ppo_clip_loss", ppo(c=3.0, clamp=20.0), {}),
    ("openrlhf", "ppo_clip_loss", ppo(clamp=20.0), {}),
    ("trl", "ppo_clip_loss", ppo(), {}),
    ("cleanrl", "ppo_clip_loss", ppo(), {}),
    ("verl", "kl_penalty", kl("k3", 20.0, 10.0), {}),
    ("openrlhf", "kl_penalty", kl("k1", None, 10.0), {}),
    ("minimind", "kl_penalty", kl("k3"), {}),
    ("verl", "value_loss", value_loss(0.5), {}),
    ("trl", "value_loss", value_loss(0.2), {}),
    ("cleanrl", "gae", gae_loop(0.99, 0.95), {}),
    ("verl", "gae", gae_loop(1.0, 1.0), {}),
    ("verl", "aggregate", global_token_mean, {"accumulation": "sum"}),
    ("minimind", "aggregate", seq_mean_all_rows, {}),
    ("verl", "policy_objective", verl_style.adapter, {"accumulation": "sum"}),
    ("trl", "policy_objective", trl_style.adapter, {"accumulation": "sum", "beta": 0.04}),
    ("minimind", "policy_objective", minimind_style.cispo_objective, {}),
    ("minimind", "group_advantages", minimind_style.grpo_advantages, {}),
]


def global_seq_mean(loss, mask, n_sequences_global=None):
    """Mean over sequences of each sequence's token mean, divided by the global sequence count
    when the caller gives it (DAPO-style global normalisation, gradients summed)."""
    m = mask.to(loss.dtype)
    rows = (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum(1)
    per_seq = rows / m.sum(1).clamp(min=1)
    n = int(mask.any(1).sum()) if n_sequences_global is None else n_sequences_global
    return per_seq.sum() / max(n, 1)


def k3_half_detached(logp, ref_logp, mask):
    """k3 = e^x − x − 1 with e^x detached: right values, gradient g·1 instead of g·(1 − e^x)."""
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    x = torch.where(m, ref_logp - logp, zero)
    return torch.where(m, torch.exp(x).detach() - x - 1, zero)


def auditor_for(fn, ref, want=None, **kwargs):
    """The audit's Auditor for `fn` (its tolerance chosen by a first case) and the first case
    the audit draws for which `want(auditor, case)` holds (any, by default): for asking one part
    of the audit (the diagnosis, a property check) directly."""
    from crosscheck.audit.api import prepare
    from crosscheck.audit.calls import audit_case
    aud, _, _ = prepare(fn, ref, **kwargs)
    for i in range(200):
        case = audit_case(aud.entry, kwargs.get("seed", 0), i)
        if want is None or want(aud, case):
            aud.run_case(case)
            return aud, case
    raise AssertionError("no case of the first 200 is wanted")
