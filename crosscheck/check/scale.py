"""`python -m crosscheck --scale N`: value, vjp and fd stages on batches of N tokens.

A full Jacobian is out of reach at N = 10^6, and random directional derivatives alone lose a
single wrong token in the noise of a million others. So the fd stage uses structure:

* policy_objective = Σ_t w_t·f_t(x_t): the per-token integrand f (policy loss + β·KL, with a
  detached factor frozen) has a *diagonal* Jacobian, so evaluating it at x ± h and x ± h/2
  (four calls, Richardson) recovers every token's derivative f'_t at once; the aggregation is
  *linear*, so its weights w are checked by exact probes: agg(l + v) − agg(l) = ⟨w, v⟩ for
  Rademacher v, which any single wrong weight changes by its full error. The hand VJP must then
  equal w ⊙ f' token by token.
* gae is linear in (rewards, values), so ⟨u, F(x + d) − F(x)⟩ = ⟨Fᵀu, d⟩ holds to rounding for
  Rademacher d, and a single wrong VJP entry shifts the right side by its full error.
GSPO runs in its diagonal "token" form here; the "sequence" form couples a row's tokens and is
checked by the default run.
"""
import math
import os
import time
from typing import List

import numpy as np
import torch

import ref_numpy
import ref_torch
from ref_common.vocab import AGG_MODES

from .. import bridge, tolerances
from . import cases as cases_mod
from .registry import POLICY_LOSS_ENTRIES, REGISTRY
from .results import StageResult, record

# one configuration per policy loss: PPO with clip-higher and the dual clip, CISPO's absolute
# cap, GSPO in its diagonal token form at its defaults
LOSSES = {
    "ppo": dict(clip_low=0.2, clip_high=0.28, clip_c=3.0),
    "cispo": dict(clip_high=5.0),
    "gspo": dict(REGISTRY["gspo_loss"].defaults, form="token"),
}
EPS = float(np.finfo(np.float64).eps)

# peak memory per token of a run, measured (`/usr/bin/time -f %M`) as the rise from 10^6 to
# 2·10^6 tokens: 305 bytes, about 38 float64 arrays of the batch alive at once; with a margin
BYTES_PER_TOKEN = 400


def available_memory():
    """Bytes the system can still give this process (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_shortfall(n_tokens):
    """None if a run of n_tokens fits in the memory available now, else a sentence saying how
    much it needs and how much there is."""
    need, have = BYTES_PER_TOKEN * n_tokens, available_memory()
    if have is None or need <= have:
        return None
    largest = have // BYTES_PER_TOKEN
    return (f"needs about {need / 2 ** 30:.1f} GiB ({BYTES_PER_TOKEN} bytes a token) and "
            f"{have / 2 ** 30:.1f} GiB is available; at most about {largest:,} tokens fit")


def _shape(n_tokens):
    B = max(1, int(round(math.sqrt(n_tokens))))
    return B, max(1, n_tokens // B)


def _policy_batch(rng, n_tokens, loss):
    B, T = _shape(n_tokens)
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = 0                                        # an empty row
    m = np.arange(T)[None] < lengths[:, None]
    logp = np.log(rng.uniform(0.05, 0.95, size=(B, T)))
    params = LOSSES[loss]
    if loss == "gspo":                                    # a row's mean log-ratio off the edges
        rho_bar = cases_mod.away(rng.normal(0, 0.3, (B, 1)), [math.log(1 - params["clip_low"]),
                                                              math.log(1 + params["clip_high"])])
        noise = rng.normal(0, 0.4, (B, T))
        noise -= np.where(m, noise, 0).sum(1, keepdims=True) / np.maximum(lengths, 1)[:, None]
        rho = rho_bar + noise
    else:
        rho = rng.normal(0, 0.35, (B, T))
        if loss == "ppo":
            rho = cases_mod.away(rho, [math.log(1 - params["clip_low"]),
                                       math.log(1 + params["clip_high"]),
                                       math.log(params["clip_c"])])
    arrays = dict(logp=logp, old_logp=logp - rho, advantages=rng.normal(size=(B, T)), mask=m,
                  ref_logp=logp + rng.normal(0, 0.3, (B, T)))
    return arrays, params


def _integrand(arrays, params, loss, beta, x):
    """Per-token f_t(x_t): policy loss + β·k3, every detached factor frozen at the base point by
    the policy loss's own freeze rule (the registry's)."""
    entry = REGISTRY[POLICY_LOSS_ENTRIES[loss]]
    policy = {k: arrays[k] for k in ("logp", "old_logp", "advantages", "mask")}
    rule = entry.freeze_for(params)
    if rule is None:
        fn, frozen, kw = entry.numpy_fn, dict(policy, logp=x), params
    else:
        fn, frozen, kw = rule(entry.numpy_fn, policy, params, "logp", x - arrays["logp"])
    return fn(**frozen, **kw) + beta * ref_numpy.kl_penalty(x, arrays["ref_logp"],
                                                             arrays["mask"], kind="k3")


def _add(timings, key, t0, evals):
    sec, n = timings.get(key, (0.0, 0))
    timings[key] = (sec + time.perf_counter() - t0, n + evals)


def _diagonal_fd(f, x, h=1e-3):
    d1 = (f(x + h) - f(x - h)) / (2 * h)
    d2 = (f(x + h / 2) - f(x - h / 2)) / h
    return (4 * d2 - d1) / 3, 4                    # Richardson: O(h^4); 4 evaluations


def run(n_tokens: int, seed: int = 0, progress=None) -> List[StageResult]:
    results = []
    timings = {}
    beta = 0.04
    for loss in LOSSES:
        rng = np.random.default_rng([seed, n_tokens, len(loss)])
        arrays, params = _policy_batch(rng, n_tokens, loss)
        m = arrays["mask"]
        t0 = time.perf_counter()
        fprime, n_evals = _diagonal_fd(lambda x: _integrand(arrays, params, loss, beta, x),
                                       arrays["logp"])
        timings[f"fd diagonal ({loss})"] = (time.perf_counter() - t0, n_evals)
        for agg in AGG_MODES:
            name = f"policy_objective[{loss}, {agg}]"
            kw = dict(loss=loss, agg=agg, beta=beta, kl_kind="k3", **params)
            info = dict(seed=seed, shape=list(m.shape), label=f"{n_tokens} tokens", case=0,
                        input="logp")
            # value
            r = StageResult(name, "value", cases=1)
            t0 = time.perf_counter()
            v_np = ref_numpy.policy_objective(**arrays, **kw)
            t = bridge.to_torch(arrays, requires_grad=("logp",))
            v_t = ref_torch.policy_objective(**t, **kw)
            record(r, bridge.compare(v_t.item(), v_np, tolerances.get("value")),
                    dict(info, got_from="ref_torch", expected_from="ref_numpy"))
            _add(timings, "value (12 configurations)", t0, 2)
            results.append(r)
            # vjp
            r = StageResult(name, "vjp", cases=1)
            t0 = time.perf_counter()
            hand = ref_numpy.policy_objective_vjp(1.0, **arrays, **kw)["logp"]
            (auto,) = bridge.backprop(v_t, 1.0, [t["logp"]])
            record(r, bridge.compare(hand, auto, tolerances.get("vjp")),
                    dict(info, got_from="ref_numpy hand VJP", expected_from="torch autograd"))
            _add(timings, "vjp (12 configurations)", t0, 2)
            results.append(r)
            # fd: aggregation weights by exact linear probes, then token by token
            r = StageResult(name, "fd", cases=1)
            t0 = time.perf_counter()
            agg_kw = dict(mode=agg)
            base_loss = rng.normal(size=m.shape)
            w = ref_numpy.aggregate_vjp(1.0, base_loss, m, **agg_kw)["loss"]
            j0 = ref_numpy.aggregate(base_loss, m, **agg_kw)
            for _ in range(3):
                v = rng.choice([-1.0, 1.0], size=m.shape)
                probe = ref_numpy.aggregate(base_loss + v, m, **agg_kw) - j0
                noise = 64 * EPS * float(np.abs(w * (base_loss + v)).sum() + abs(j0))
                record(r, bridge.compare(float((w * v).sum()), probe, tolerances.get("probe"),
                                   extra=noise),
                        dict(info, input="loss", mode="exact linear probe of the aggregation",
                             got_from="⟨hand weights, v⟩", expected_from="agg(l + v) − agg(l)"))
            expected = np.where(m, w * fprime, 0.0)
            scale = max(1.0, float(np.abs(expected).max()))
            record(r, bridge.compare(hand, expected, tolerances.get("fd"), scale),
                    dict(info, mode="diagonal finite differences of the per-token integrand",
                         got_from="ref_numpy hand VJP", expected_from="w ⊙ f' (scipy-free FD)"))
            _add(timings, "fd probes + compare (12)", t0, 7)
            results.append(r)
        if progress:
            progress(loss)
    results += _gae(n_tokens, seed, timings)
    return results, timings


def _gae(n_tokens, seed, timings):
    rng = np.random.default_rng([seed, n_tokens, 99])
    B, T = _shape(n_tokens)
    lengths = rng.integers(1, T + 1, size=B)
    m = (np.arange(T)[None] < lengths[:, None]) & (rng.random((B, T)) < 0.9)
    r, v, lv = rng.normal(size=(B, T)), rng.normal(size=(B, T)), rng.normal(size=B)
    kw = dict(gamma=0.99, lam=0.95, last_value=lv)
    out = []
    info = dict(seed=seed, shape=[B, T], label=f"{n_tokens} tokens, holed", case=0)
    t0 = time.perf_counter()
    a_np, ret_np = ref_numpy.gae(r, v, m, **kw)
    rt, vt = torch.tensor(r, requires_grad=True), torch.tensor(v, requires_grad=True)
    a_t, ret_t = ref_torch.gae(rt, vt, torch.tensor(m), gamma=0.99, lam=0.95,
                               last_value=torch.tensor(lv))
    res = StageResult("gae", "value", cases=1)
    record(res, bridge.compare(a_t.detach().numpy(), a_np, tolerances.get("value")),
            dict(info, input="advantages", got_from="ref_torch", expected_from="ref_numpy"))
    record(res, bridge.compare(ret_t.detach().numpy(), ret_np, tolerances.get("value")),
            dict(info, input="returns", got_from="ref_torch", expected_from="ref_numpy"))
    out.append(res)
    timings["gae value"] = (time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    u = (rng.normal(size=(B, T)), rng.normal(size=(B, T)))
    hand = ref_numpy.gae_vjp(u, r, v, m, **kw)
    auto = dict(zip(("rewards", "values"), bridge.backprop((a_t, ret_t), u, [rt, vt])))
    res = StageResult("gae", "vjp", cases=1)
    for name in ("rewards", "values"):
        record(res, bridge.compare(hand[name], auto[name], tolerances.get("vjp")),
                dict(info, input=name, got_from="ref_numpy hand VJP",
                     expected_from="torch autograd"))
    out.append(res)
    timings["gae vjp"] = (time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    res = StageResult("gae", "fd", cases=1)
    base = np.concatenate([x.ravel() for x in (a_np, ret_np)])
    uu = np.concatenate([x.ravel() for x in u])
    for name in ("rewards", "values"):
        for _ in range(2):
            d = rng.choice([-1.0, 1.0], size=(B, T)) * m
            shifted = dict(rewards=r, values=v)
            shifted[name] = shifted[name] + d
            moved = np.concatenate([x.ravel() for x in ref_numpy.gae(
                shifted["rewards"], shifted["values"], m, **kw)])
            lhs = float(uu @ (moved - base))
            rhs = float((hand[name] * d).sum())
            noise = 64 * EPS * float(np.abs(uu * moved).sum() + np.abs(uu * base).sum())
            record(res, bridge.compare(rhs, lhs, tolerances.get("probe"), extra=noise),
                    dict(info, input=name, mode="exact linear probe ⟨u, F(x + d) − F(x)⟩",
                         got_from="⟨hand VJP, d⟩", expected_from="⟨u, F(x + d) − F(x)⟩"))
    out.append(res)
    timings["gae fd"] = (time.perf_counter() - t0, 4)
    return out
