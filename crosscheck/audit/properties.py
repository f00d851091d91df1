"""Property checks: what must hold of a trainer's function beyond matching the reference on one
batch. A registry entry lists the ones that apply to it (`Entry.checks`)."""
from typing import List, Optional

import numpy as np
import torch

from .. import bridge
from .auditor import Auditor
from .calls import GLOBAL_KW, exception_text
from .model import Outcome, plural


def permutation_check(aud: Auditor, case, rng) -> Optional[Outcome]:
    """Group advantages: shuffling rows together with their group ids permutes the outputs."""
    if "permutation" not in aud.entry.checks or not aud.accepts("group_ids"):
        return None
    data, _ = aud.inputs_for(case)
    if data is None or "group_ids" not in data:
        return None
    data = {k: v for k, v in data.items() if k != "group_size"}
    try:
        base = aud.to_numpy(aud.call(data)[0])[0]
        perm = rng.permutation(base.shape[0])
        shuffled = {k: (v[perm] if isinstance(v, np.ndarray) else v) for k, v in data.items()}
        moved = aud.to_numpy(aud.call(shuffled)[0])[0]
    except Exception as exc:
        return Outcome("permutation", False, exception_text(exc))
    kappa = np.broadcast_to(np.asarray(aud.condition(data)[0], dtype=np.float64), base.shape)
    same = bridge.within(moved, base[perm], aud.tol, cond=np.maximum(kappa, kappa[perm])) | \
        (np.isnan(moved) & np.isnan(base[perm]))
    if not same.all():
        i = int(np.argwhere(~same)[0][0])
        ref = aud.reference_outputs(data)[0]
        right = aud.mismatch(base, ref, aud.valid_of(data, ref.shape), kappa) is None
        why = ("groups taken by position?" if right else
               "your unshuffled values differ from the reference's too: see the value check")
        return Outcome("permutation", False,
                       f"shuffling rows with their group_ids changed an advantage: row {perm[i]} "
                       f"was {base[perm[i]]:.10g}, became {moved[i]:.10g} ({why})",
                       loose=aud.loose(moved, base[perm], np.ones(base.shape, bool),
                                       np.maximum(kappa, kappa[perm])))
    return Outcome("permutation", True)


def microbatch_check(aud: Auditor, case) -> List[Outcome]:
    """The gradient accumulated over 2 and 4 micro-batches, the way the trainer accumulates
    ("mean" of micro-batch losses, each micro-batch given its own counts, or "sum" of losses
    each normalised by the whole batch's counts, given to a function that names them), equals
    the full batch's, and each micro-batch's loss is finite. A micro-batch whose rows are all
    masked gives a constant, gradient-free loss: it adds nothing, as it does in a trainer."""
    if "microbatch" not in aud.entry.checks or aud.backend != "torch" or \
            aud.accumulation == "none":
        return []
    data, _ = aud.inputs_for(case)
    if data is None:
        return []
    if not aud.accumulation_assumed:
        return _microbatch_under(aud, data, aud.accumulation)
    # undeclared: no verdict on one assumed model. Try each way a trainer accumulates; a
    # function that is split-dependent under all of them is wrong under any trainer
    tried = {acc: _microbatch_under(aud, data, acc) for acc in ("sum", "mean")}
    fits = [acc for acc, outs in tried.items() if all(o.ok for o in outs)]
    if not any(tried.values()):
        return []
    if fits:
        how = " or ".join(_ACCUMULATION_WORDS[a] for a in fits)
        return [Outcome("microbatch", True, f"conforms if your trainer accumulates {how} "
                                            f"(accumulation was not declared)", info=True)]
    first = {acc: next(o for o in outs if not o.ok) for acc, outs in tried.items() if outs}
    return [Outcome("microbatch", False,
                    "split-dependent under every accumulation a trainer uses (none declared): "
                    + "; ".join(f"{_ACCUMULATION_WORDS[a]}: {o.message}"
                                for a, o in first.items())
                    + "; if your trainer takes one optimizer step per batch, with no "
                      "micro-batches, declare accumulation='none'",
                    loose=all(o.loose for o in first.values()))]


_ACCUMULATION_WORDS = {"sum": "by summing micro-batch gradients, each normalised by the "
                              "whole batch's counts",
                       "mean": "by averaging micro-batch gradients, each micro-batch "
                               "normalised by its own counts"}


def _microbatch_under(aud: Auditor, data, accumulation) -> List[Outcome]:
    """The micro-batch check of one case's data under one accumulation model."""
    wrt = aud.entry.diff[0]
    B = data[wrt].shape[0]
    local = aud.variant.get("microbatch") == "local"    # each micro-batch normalised by its own
    hand = aud.reference_vjp(data, 1.0)[wrt]
    m = data["mask"]
    full = aud.global_counts(data)
    out = []
    unused = aud.entry.unused(aud.params) if aud.entry.unused else ()
    groups = data.get("group_size")
    for K in (2, 4):
        if B % K or B < K:
            continue
        total = np.zeros(data[wrt].shape)
        size = B // K
        if groups is not None and size % groups and "group_size" not in unused:
            continue            # a micro-batch would split a prompt's group, which a trainer keeps
        if local:
            hand = np.zeros(data[wrt].shape)
            if any(not np.asarray(m[k * size:(k + 1) * size], dtype=bool).any()
                   for k in range(K)):
                continue        # an empty micro-batch's own mean is 0/0: nothing to compare
        try:
            for k in range(K):
                rows = slice(k * size, (k + 1) * size)
                part = {key: (v[rows] if isinstance(v, np.ndarray) and v.shape[:1] == (B,) else v)
                        for key, v in data.items()
                        if not (key == "group_size" and key in unused)}   # rows, not groups
                if local:
                    hand[rows] = aud.reference_vjp(part, 1.0 / K if accumulation == "mean"
                                                   else 1.0)[wrt]
                raw, leaves = aud.call(part, grad_wrt=(wrt,),
                                       extra=full if accumulation == "sum" else None)
                loss = aud.outputs_of(raw)[0]
                value = bridge.to_numpy(loss)
                if not np.isfinite(value).all():
                    n = int(np.asarray(part["mask"], dtype=bool).sum())
                    raise FloatingPointError(
                        f"micro-batch {k + 1} of {K} (rows {k * size}..{(k + 1) * size - 1}, "
                        f"{plural(n, 'valid token')}) gives a loss of "
                        f"{value if value.ndim == 0 else value[~np.isfinite(value)][0]}: a "
                        f"trainer's loss is then non-finite")
                weight = 1.0 / K if accumulation == "mean" else 1.0
                (gr,) = bridge.backprop(loss, weight, [leaves[wrt]])
                if gr is not None:
                    total[rows] = gr
        except FloatingPointError as exc:
            out.append(Outcome("microbatch", False, str(exc)))
            continue
        except Exception as exc:
            out.append(Outcome("microbatch", False, exception_text(exc)))
            continue
        i = aud.mismatch(total, hand, m.astype(bool))
        if i is not None:
            ratio = total[i] / hand[i] if hand[i] else float("inf")
            msg = (f"{K} micro-batches accumulated ({accumulation} of micro-batch "
                   f"gradients) give d/d{wrt}{list(i)} = {total[i]:.6g}, the full batch "
                   f"{hand[i]:.6g} (×{ratio:.3g})")
            if accumulation == "sum" and not any(aud.accepts(k) for k in GLOBAL_KW):
                msg += ("; your function takes no global count: a trainer that sums micro-batch "
                        "gradients normalises each by the whole batch's counts, which the audit "
                        f"passes to a function that names {' or '.join(GLOBAL_KW)}")
            out.append(Outcome("microbatch", False, msg,
                               loose=aud.loose(total, hand, m.astype(bool))))
        else:
            out.append(Outcome("microbatch", True))
    return out


def _expected_gradient(per_token, logp, theta, weights, use):
    """E_π[∇ S] wrt θ for a KL term used as a loss (S = k) or as a detached reward on the
    score function (S = sg(k)·log π); and the scale of its per-category terms."""
    if use == "reward":
        k = torch.as_tensor(bridge.to_numpy(per_token))
        (g,) = bridge.backprop(logp, weights * k, [theta])
        scale = float((weights * k.abs()).sum())
    else:
        g, d = bridge.backprop(per_token, weights, [theta, logp])
        scale = 0.0 if d is None else float(np.abs(d).sum())
    return g, scale


def _vanishes(g, scale, tol) -> bool:
    """No expected gradient: none at all, or within the tolerance of its terms' scale."""
    return g is None or float(np.abs(g).max()) <= tol.rtol * scale + tol.atol


def _per_token_output(out, V):
    """The output as a [1, V] tensor, or a phrase naming what it is instead."""
    if not isinstance(out, torch.Tensor):
        return f"a {type(out).__name__}, not a tensor"
    if tuple(out.shape) != (1, V):
        return f"a tensor of shape {tuple(out.shape)}"
    if not out.dtype.is_floating_point:
        return f"a {str(out.dtype).replace('torch.', '')} tensor"
    return out


def kl_direction_check(aud: Auditor, rng) -> Optional[Outcome]:
    """In exact expectation over a softmax policy, the KL term alone, used as the trainer uses
    it (a loss, differentiated; or a reward, detached, through the score function), pushes π
    the way the reference estimator used the same way does. Against it (a negative inner
    product) is a flipped sign. An expected gradient within the tolerance of the scale of its
    per-category terms is no gradient at all: as a loss, k1 has none (a warning)."""
    if "kl_direction" not in aud.entry.checks or aud.backend != "torch" or aud.kl_use is None:
        return None
    if not (aud.accepts("logp") and aud.accepts("ref_logp")) or aud.adapter.unmet():
        return None                            # the adapter cannot take them (see the verdict)
    use = aud.kl_use
    none = Outcome("kl_direction", True, warn=True, message=(
        "as a loss your KL term has no expected gradient (k1 used as a loss?)" if use == "loss"
        else "as a reward your KL term has no expected gradient") +
        ": it does not pull π toward the reference")
    worst = None
    for _ in range(4):
        V = 6
        theta = torch.tensor(rng.normal(0, 0.6, V), requires_grad=True)
        ref = torch.tensor(rng.normal(0, 0.6, V))
        logp = torch.log_softmax(theta, -1)
        ref_logp = torch.log_softmax(ref, -1)
        weights = logp.exp().detach()          # every category once, weighted by π: E_π exactly
        inputs = dict(logp=logp[None], ref_logp=ref_logp[None],
                      mask=torch.ones(1, V, dtype=torch.bool))
        before = {k: v.detach().clone() for k, v in inputs.items()}
        try:
            raw = aud.invoke(**{k: v for k, v in inputs.items() if aud.accepts(k)})
            out = aud.outputs_of(raw)[0]
        except Exception as exc:              # the user's code, or what it returned: report it
            return Outcome("kl_direction", False, exception_text(exc))
        changed = [k for k, v in inputs.items() if not torch.equal(v.detach(), before[k])]
        if changed:
            return Outcome("kl_direction", False, f"your function changed its input "
                                                  f"{', '.join(changed)} in place")
        seen = _per_token_output(out, V)
        if isinstance(seen, str):
            return Outcome("kl_direction", False, f"your function returned {seen} for logp of "
                                                  f"shape (1, {V}); expected a tensor of shape "
                                                  f"(1, {V}), one KL term per token")
        try:
            g, scale = _expected_gradient(seen[0], logp, theta, weights, use)
        except Exception as exc:              # e.g. an output that carries no gradient
            return Outcome("kl_direction", False, exception_text(exc))
        logp = torch.log_softmax(theta, -1)    # a fresh graph for the reference's gradient
        theirs = aud.entry.torch_fn(**dict(inputs, logp=logp[None]), **aud.params)[0]
        g_ref, scale_ref = _expected_gradient(theirs, logp, theta, weights, use)
        negated = bridge.within(bridge.to_numpy(seen[0]), -bridge.to_numpy(theirs), aud.tol).all()
        if _vanishes(g_ref, scale_ref, aud.tol):
            if _vanishes(g, scale, aud.tol):
                return none                    # as the reference: none (k1 as a loss)
            continue                           # the reference has none: nothing to compare
        if _vanishes(g, scale, aud.tol):
            return none
        cos = float(g @ g_ref / (np.linalg.norm(g) * np.linalg.norm(g_ref)))
        if cos < 0:
            worst = (f"your KL term alone, used as a {use}, pushes π against the reference "
                     f"estimator's expected gradient (cosine {cos:.3f}): " +
                     ("its values are the reference's negated, a flipped sign" if negated else
                      "its values differ from the reference's by more than a sign (see the "
                      "value check)"))
    if worst:
        return Outcome("kl_direction", False, worst)
    return Outcome("kl_direction", True)
