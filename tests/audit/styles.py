"""Correct implementations written in the styles trainers use: explicit loops, vectorised
tensor code, in-place updates, float32 arithmetic, computed under torch.no_grad(), returning
Python floats, NumPy. Each is written from the equation (never by calling a reference), and each
must conform: a failure here is a false alarm of the audit's.

STYLES rows: (id, ref, fn, audit keyword arguments)."""
import numpy as np
import torch

from tests.audit.corpus import gae_loop, grpo, kl, ppo


def _zero(x):
    return torch.zeros((), dtype=x.dtype)


def _per_token(advantages, like):
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


# ================================================================ group advantages
def grpo_scatter(ddof, eps, singleton="zero"):
    """Vectorised over groups with index_add (no Python loop); a group of one gets 0, or keeps
    its reward (mean 0, std 1)."""
    def fn(rewards, group_ids, valid=None):
        keep = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
        ids = torch.unique(group_ids, return_inverse=True)[1]
        G = int(ids.max()) + 1
        r = torch.where(keep, rewards, _zero(rewards))
        n = torch.zeros(G, dtype=rewards.dtype).index_add(0, ids, keep.to(rewards.dtype))
        mean = torch.zeros(G, dtype=rewards.dtype).index_add(0, ids, r) / n.clamp(min=1)
        dev = torch.where(keep, rewards - mean[ids], _zero(rewards))
        var = torch.zeros(G, dtype=rewards.dtype).index_add(0, ids, dev ** 2) / \
            (n - ddof).clamp(min=1)
        alone = n[ids] < 2
        std = torch.sqrt(torch.where(alone, torch.ones_like(var[ids]), var[ids]))
        out = dev / (std + eps)
        if singleton == "keep":
            out = torch.where(alone, r / (1.0 + eps), out)
        else:
            out = torch.where(alone, _zero(r), out)
        return torch.where(keep, out, _zero(r))
    return fn


def grpo_in_place(ddof, eps):
    """Loop over groups, updating a clone in place (sub_, div_)."""
    def fn(rewards, group_ids):
        out = rewards.clone()
        for g in torch.unique(group_ids):
            idx = (group_ids == g).nonzero().flatten()
            if idx.numel() < 2:
                out[idx] = 0.0
                continue
            block = out[idx]
            block.sub_(rewards[idx].mean()).div_(rewards[idx].std(unbiased=bool(ddof)) + eps)
            out[idx] = block
        return out
    return fn


def grpo_float32(ddof, eps):
    """Float32 arithmetic with a two-pass variance, returning float32 (the precision judged)."""
    def fn(rewards, group_ids):
        r = rewards.float()
        out = torch.zeros_like(r)
        for g in torch.unique(group_ids):
            i = group_ids == g
            x = r[i]
            if x.numel() > 1:
                out[i] = (x - x.mean()) / (x.std(unbiased=bool(ddof)) + eps)
        return out
    return fn


def grpo_no_grad(ddof, eps):
    """Computed under torch.no_grad(), as trainers compute advantages."""
    inner = grpo(ddof, eps)

    @torch.no_grad()
    def fn(rewards, group_ids, valid=None):
        return inner(rewards, group_ids, valid)
    return fn


def grpo_group_size(ddof, eps):
    """Rows of a group consecutive (group_size given): reshape, as MiniMind and TRL do."""
    def fn(rewards, group_size):
        g = rewards.view(-1, group_size)
        if group_size < 2:
            return torch.zeros_like(rewards)
        std = g.std(dim=1, unbiased=bool(ddof), keepdim=True)
        return ((g - g.mean(dim=1, keepdim=True)) / (std + eps)).view(-1)
    return fn


def grpo_numpy(ddof, eps):
    def fn(rewards, group_ids):
        out = np.zeros_like(rewards)
        for g in np.unique(group_ids):
            i = group_ids == g
            if i.sum() > 1:
                out[i] = (rewards[i] - rewards[i].mean()) / (rewards[i].std(ddof=ddof) + eps)
        return out
    return fn


# ================================================================ whitening
def whiten_in_place(ddof, eps):
    def fn(x, mask):
        m = mask.bool()
        v = x[m]
        out = torch.where(m, x, _zero(x)).clone()
        out.sub_(v.mean()).mul_(torch.rsqrt(v.var(unbiased=bool(ddof)) + eps))
        return out.masked_fill_(~m, 0.0)
    return fn


def whiten_float32(ddof, eps):
    def fn(x, mask):
        m = mask.bool()
        xf = torch.where(m, x, _zero(x)).float()
        v = xf[m]
        out = (xf - v.mean()) * torch.rsqrt(v.var(unbiased=bool(ddof)) + eps)
        return torch.where(m, out, torch.zeros((), dtype=torch.float32))
    return fn


def whiten_no_grad(ddof, eps):
    @torch.no_grad()
    def fn(x, mask):
        m = mask.bool()
        v = x[m]
        return torch.where(m, (x - v.mean()) / torch.sqrt(v.var(unbiased=bool(ddof)) + eps),
                           _zero(x))
    return fn


def whiten_numpy(ddof, eps):
    def fn(x, mask):
        m = mask.astype(bool)
        v = x[m]
        return np.where(m, (x - v.mean()) / np.sqrt(v.var(ddof=ddof) + eps), 0.0)
    return fn


# ================================================================ GAE
def gae_float32_no_grad(gamma, lam):
    """The loop in float32 under no_grad; masked positions are skipped (carry the running
    advantage and the next value)."""
    @torch.no_grad()
    def fn(rewards, values, mask):
        B, T = rewards.shape
        m = mask.bool()
        r = torch.where(m, rewards, _zero(rewards)).float()
        v = torch.where(m, values, _zero(values)).float()
        adv = torch.zeros(B, T, dtype=torch.float32)
        running = torch.zeros(B, dtype=torch.float32)
        nextv = torch.zeros(B, dtype=torch.float32)
        for t in range(T - 1, -1, -1):
            delta = r[:, t] + gamma * nextv - v[:, t]
            new = delta + gamma * lam * running
            running = torch.where(m[:, t], new, running)
            nextv = torch.where(m[:, t], v[:, t], nextv)
            adv[:, t] = torch.where(m[:, t], running, torch.zeros((), dtype=torch.float32))
        return adv, torch.where(m, adv + v, torch.zeros((), dtype=torch.float32))
    return fn


def gae_vectorised(gamma, lam):
    """Per row, the valid tokens compressed, then A = U·δ with U[j, k] = (γλ)^(k − j), k ≥ j."""
    def fn(rewards, values, mask):
        B, T = rewards.shape
        adv = torch.zeros_like(rewards)
        for b in range(B):
            idx = mask[b].bool().nonzero().flatten()
            if idx.numel() == 0:
                continue
            r, v = rewards[b, idx], values[b, idx]
            nextv = torch.cat([v[1:], torch.zeros(1, dtype=v.dtype)])
            delta = r + gamma * nextv - v
            n = idx.numel()
            k = torch.arange(n, dtype=v.dtype)
            power = (k[None, :] - k[:, None])
            U = torch.where(power >= 0, (gamma * lam) ** power.clamp(min=0), _zero(v))
            adv = adv.index_put((torch.full_like(idx, b), idx), U @ delta)
        zero = _zero(values)
        return adv, torch.where(mask.bool(), adv + values, zero)
    return fn


def gae_numpy(gamma, lam):
    def fn(rewards, values, mask, dones=None, last_value=None):
        B, T = rewards.shape
        m = mask.astype(bool)
        d = np.zeros((B, T)) if dones is None else dones.astype(float)
        adv = np.zeros((B, T))
        running = np.zeros(B)
        nextv = np.zeros(B) if last_value is None else last_value.copy()
        for t in range(T - 1, -1, -1):
            r, v = np.where(m[:, t], rewards[:, t], 0.0), np.where(m[:, t], values[:, t], 0.0)
            delta = r + gamma * (1 - d[:, t]) * nextv - v
            new = delta + gamma * lam * (1 - d[:, t]) * running
            running = np.where(m[:, t], new, running)
            nextv = np.where(m[:, t], v, nextv)
            adv[:, t] = np.where(m[:, t], running, 0.0)
        return adv, np.where(m, adv + np.where(m, values, 0.0), 0.0)
    return fn


def discounted_returns_loop(gamma):
    @torch.no_grad()
    def fn(rewards, mask):
        B, T = rewards.shape
        m = mask.bool()
        out = torch.zeros_like(rewards)
        running = torch.zeros(B, dtype=rewards.dtype)
        for t in range(T - 1, -1, -1):
            running = torch.where(m[:, t], rewards[:, t] + gamma * running, running)
            out[:, t] = torch.where(m[:, t], running, _zero(rewards))
        return out
    return fn


# ================================================================ losses
def ppo_float32(lo=0.2, hi=0.2, clamp=None):
    def fn(logp, old_logp, advantages, mask):
        m = mask.bool()
        z = torch.zeros((), dtype=torch.float32)
        lr = torch.where(m, logp - old_logp, _zero(logp)).float()
        if clamp:
            lr = lr.clamp(-clamp, clamp)
        A = torch.where(m, _per_token(advantages, logp), _zero(logp)).float()
        ratio = torch.exp(lr)
        loss = torch.max(-A * ratio, -A * ratio.clamp(1 - lo, 1 + hi))
        return torch.where(m, loss, z)
    return fn


def ppo_token_loop(lo=0.2, hi=0.2):
    """One token at a time, with Python control flow choosing the branch."""
    def fn(logp, old_logp, advantages, mask):
        B, T = logp.shape
        A = _per_token(advantages, logp)
        rows = []
        for b in range(B):
            row = []
            for t in range(T):
                if not bool(mask[b, t]):
                    row.append(_zero(logp))
                    continue
                ratio = torch.exp(logp[b, t] - old_logp[b, t])
                a = A[b, t]
                clipped = torch.clamp(ratio, 1 - lo, 1 + hi)
                row.append(torch.max(-a * ratio, -a * clipped))
            rows.append(torch.stack(row))
        return torch.stack(rows)
    return fn


def ppo_numpy(lo=0.2, hi=0.2):
    def fn(logp, old_logp, advantages, mask):
        m = mask.astype(bool)
        A = advantages[:, None] if advantages.ndim == 1 else advantages
        ratio = np.exp(np.where(m, logp - old_logp, 0.0))
        A = np.where(m, A, 0.0)
        return np.where(m, np.maximum(-A * ratio, -A * np.clip(ratio, 1 - lo, 1 + hi)), 0.0)
    return fn


def kl_openrlhf_float32(logp, ref_logp, mask):
    """OpenRLHF's k1 capped at ±10, computed and returned in float32."""
    x = logp.float() - ref_logp.float()
    return (x.clamp(-10, 10) * mask).float()


def k3_float32_safe(logp, ref_logp, mask):
    """k3 in float32, the log-ratio bounded below before exp so that the capped estimate has no
    overflowing derivative (k3 ≥ 10 already there)."""
    u = (ref_logp.float() - logp.float()).clamp(max=10.0)
    return (torch.exp(u) - 1 - u).clamp(max=10.0) * mask


def value_loss_float32(clip):
    def fn(values, old_values, returns, mask):
        m = mask.bool()
        v, vo, R = (torch.where(m, t, _zero(t)).float() for t in (values, old_values, returns))
        clipped = vo + (v - vo).clamp(-clip, clip)
        out = 0.5 * torch.max((v - R) ** 2, (clipped - R) ** 2)
        return torch.where(m, out, torch.zeros((), dtype=torch.float32))
    return fn


def cispo_absolute(cap):
    def fn(logp, old_logp, advantages, mask):
        m = mask.bool()
        A = torch.where(m, _per_token(advantages, logp), _zero(logp))
        ratio = torch.exp(torch.where(m, logp - old_logp, _zero(logp)))
        w = ratio.clamp(max=cap).detach()
        return torch.where(m, -w * A * torch.where(m, logp, _zero(logp)), _zero(logp))
    return fn


def gspo_sequence(lo, hi):
    def fn(logp, old_logp, advantages, mask):
        m = mask.to(logp.dtype)
        lr = torch.where(mask.bool(), logp - old_logp, _zero(logp))
        s = torch.exp((lr * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1))
        A = torch.where(mask.bool(), _per_token(advantages, logp), _zero(logp))
        loss = torch.max(-A * s, -A * s.clamp(1 - lo, 1 + hi))
        return torch.where(mask.bool(), loss, _zero(logp))
    return fn


def token_mean_global(loss, mask, n_tokens_global):
    """A token mean over the whole batch's count, which the trainer passes (required)."""
    return (torch.where(mask.bool(), loss, _zero(loss))).sum() / max(n_tokens_global, 1)


def seq_mean_float32(loss, mask, n_sequences_global=None):
    """Per-sequence token means in float32, summed over the non-empty rows and divided by the
    whole batch's count of them (given by the trainer, else this batch's)."""
    m = mask.float()
    rows = (torch.where(mask.bool(), loss, _zero(loss)).float() * m).sum(1)
    lengths = m.sum(1)
    n = int((lengths > 0).sum()) if n_sequences_global is None else n_sequences_global
    return (rows / lengths.clamp(min=1)).sum() / max(n, 1)


@torch.no_grad()
def approx_kl_metric(logp, old_logp, mask):
    """A logged metric: k1 mean as a Python float."""
    m = mask.bool()
    n = int(m.sum())
    return float(torch.where(m, old_logp - logp, _zero(logp)).sum() / n) if n else 0.0


def clip_fraction_metric(logp, old_logp, advantages, mask):
    """verl's pg_clipfrac: where the clipped loss is strictly the larger, as a Python float."""
    m = mask.bool()
    A = _per_token(advantages, logp)
    ratio = torch.exp(torch.where(m, logp - old_logp, _zero(logp)))
    hit = (-A * ratio.clamp(0.8, 1.2)) > (-A * ratio)
    n = int(m.sum())
    return (hit & m).sum().item() / n if n else 0.0


STYLES = [
    ("group-scatter-verl", "group_advantages", grpo_scatter(1, 1e-6, "keep"),
     dict(profile="verl")),
    ("group-scatter", "group_advantages", grpo_scatter(0, 1e-4), dict(ddof=0, eps=1e-4)),
    ("group-in-place", "group_advantages", grpo_in_place(1, 1e-4), dict(profile="trl")),
    ("group-float32", "group_advantages", grpo_float32(0, 1e-4), dict(profile="minimind")),
    ("group-no-grad", "group_advantages", grpo_no_grad(1, 1e-4), dict(ddof=1, eps=1e-4)),
    ("group-size-reshape", "group_advantages", grpo_group_size(0, 1e-4),
     dict(profile="minimind")),
    ("group-numpy", "group_advantages", grpo_numpy(1, 1e-9),
     dict(profile="openrlhf", backend="numpy")),
    ("whiten-in-place", "whiten", whiten_in_place(1, 1e-8), dict(profile="verl")),
    ("whiten-float32", "whiten", whiten_float32(0, 1e-8), dict(profile="minimind")),
    ("whiten-no-grad", "whiten", whiten_no_grad(1, 1e-8), dict(profile="verl")),
    ("whiten-numpy", "whiten", whiten_numpy(0, 1e-8), dict(profile="minimind",
                                                          backend="numpy")),
    ("gae-loop", "gae", gae_loop(0.99, 0.95), dict(profile="cleanrl")),
    ("gae-float32-no-grad", "gae", gae_float32_no_grad(1.0, 1.0), dict(profile="verl")),
    ("gae-vectorised", "gae", gae_vectorised(0.99, 0.95), dict(profile="cleanrl")),
    ("gae-numpy", "gae", gae_numpy(1.0, 0.95), dict(gamma=1.0, lam=0.95, backend="numpy")),
    ("returns-loop", "discounted_returns", discounted_returns_loop(1.0), dict(profile="verl")),
    ("ppo-vectorised", "ppo_clip_loss", ppo(), dict(profile="cleanrl")),
    ("ppo-float32", "ppo_clip_loss", ppo_float32(clamp=20.0), dict(profile="openrlhf")),
    ("ppo-token-loop", "ppo_clip_loss", ppo_token_loop(), dict(profile="trl", cases=12)),
    ("kl-k3", "kl_penalty", kl("k3"), dict(profile="trl")),
    ("kl-openrlhf-float32", "kl_penalty", kl_openrlhf_float32, dict(profile="openrlhf")),
    ("kl-k3-float32", "kl_penalty", k3_float32_safe, dict(kind="k3", clamp=(None, 10.0))),
    ("value-float32", "value_loss", value_loss_float32(0.2), dict(profile="trl")),
    ("cispo", "cispo_loss", cispo_absolute(5.0), dict(profile="minimind")),
    ("gspo-sequence", "gspo_loss", gspo_sequence(0.2, 0.2), dict(profile="openrlhf")),
    ("token-mean-global", "aggregate", token_mean_global, dict(profile="verl")),
    ("seq-mean-float32", "aggregate", seq_mean_float32,
     dict(mode="seq-mean-token-mean", empty_rows="exclude", accumulation="sum")),
    ("approx-kl-metric", "approx_kl", approx_kl_metric, dict(profile="verl")),
    ("clip-fraction-metric", "clip_fraction", clip_fraction_metric, dict(profile="verl")),
]


# ================================================================ planted bugs, in the same styles
def grpo_one_pass_float32(rewards, group_ids):
    """var = (Σx² − (Σx)²/n)/(n − 1) in float32: every digit lost on rewards near 1000."""
    r = rewards.float()
    out = torch.zeros_like(r)
    for g in torch.unique(group_ids):
        i = group_ids == g
        x = r[i]
        n = x.numel()
        if n > 1:
            var = ((x * x).sum() - x.sum() ** 2 / n) / (n - 1)
            out[i] = (x - x.mean()) / (torch.sqrt(var.clamp(min=0)) + 1e-4)
    return out


def whiten_one_pass_float32(x, mask):
    m = mask.bool()
    v = x[m].float()
    n = v.numel()
    var = ((v * v).sum() - v.sum() ** 2 / n) / n
    out = (x.float() - v.mean()) * torch.rsqrt(var.clamp(min=0) + 1e-8)
    return torch.where(m, out, torch.zeros((), dtype=torch.float32))


def gae_ignores_dones(rewards, values, mask, dones=None, last_value=None):
    return gae_loop(0.99, 0.95)(rewards, values, mask, None, last_value)


def ppo_float32_overflow(logp, old_logp, advantages, mask):
    """No log-ratio clamp in float32: exp overflows past |ρ| ≈ 89 (the reference's float64 does
    not)."""
    m = mask.bool()
    ratio = torch.exp((logp - old_logp).float())
    A = _per_token(advantages, logp).float()
    loss = torch.max(-A * ratio, -A * ratio.clamp(0.8, 1.2))
    return torch.where(m, loss, torch.zeros((), dtype=torch.float32))


def ppo_advantages_clipped(logp, old_logp, advantages, mask):
    """Advantages clipped to ±5 before the loss: invisible while |A| < 5."""
    return ppo()(logp, old_logp, advantages.clamp(-5, 5), mask)


def objective_kl_unmasked(logp, old_logp, advantages, mask, ref_logp):
    """The KL term summed over padding too: it vanishes only where logp and ref_logp agree."""
    m = mask.to(logp.dtype)
    pg = ppo()(logp, old_logp, advantages, mask)
    x = ref_logp - logp
    return ((pg * m).sum() + 0.1 * (torch.exp(x) - x - 1).sum()) / m.sum()


def per_token_nan_at_padding(logp, old_logp, advantages, mask):
    """A per-token loss divided by its row's length: NaN at the padding of an empty row."""
    m = mask.to(logp.dtype)
    return ppo()(logp, old_logp, advantages, mask) / m.sum(1, keepdim=True) * m.sum(1).mean()


def token_mean_no_guard(loss, mask, n_tokens_global=None):
    """The local count when no global one is given, and no guard: NaN on an empty micro-batch."""
    n = mask.sum() if n_tokens_global is None else n_tokens_global
    return torch.where(mask.bool(), loss, _zero(loss)).sum() / mask.sum() * (mask.sum() / n)


def approx_kl_backwards(logp, old_logp, mask):
    m = mask.bool()
    return torch.where(m, logp - old_logp, _zero(logp)).sum() / m.sum().clamp(min=1)


BUGS = [
    # (id, ref, fn, audit keyword arguments, the checks of which at least one must fail)
    ("group-one-pass-float32", "group_advantages", grpo_one_pass_float32, dict(profile="trl"),
     {"value"}),
    ("whiten-one-pass-float32", "whiten", whiten_one_pass_float32, dict(profile="minimind"),
     {"value"}),
    ("gae-ignores-dones", "gae", gae_ignores_dones, dict(profile="cleanrl"), {"value"}),
    ("ppo-advantages-clipped", "ppo_clip_loss", ppo_advantages_clipped, dict(profile="cleanrl"),
     {"value"}),
    ("objective-kl-unmasked", "policy_objective", objective_kl_unmasked,
     dict(loss="ppo", agg="token-mean", beta=0.1, kl_kind="k3", clip_low=0.2), {"mask"}),
    ("per-token-nan-at-padding", "ppo_clip_loss", per_token_nan_at_padding,
     dict(profile="cleanrl"), {"finite"}),
    ("token-mean-no-guard", "aggregate", token_mean_no_guard, dict(profile="openrlhf"),
     {"microbatch"}),
    ("approx-kl-backwards", "approx_kl", approx_kl_backwards, dict(profile="verl"), {"value"}),
]
