"""Property checks: what must hold of a trainer's function beyond matching the reference on one
batch. A registry entry lists the ones that apply to it (`Entry.checks`)."""
from typing import List, Optional

import numpy as np
import torch

from .. import bridge
from .auditor import Auditor
from .model import Outcome


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
        return Outcome("permutation", False, f"{type(exc).__name__}: {exc}")
    i = aud.mismatch(moved, base[perm], np.ones(base.shape, dtype=bool))
    if i is not None:
        i = i[0]
        return Outcome("permutation", False,
                       f"shuffling rows with their group_ids changed an advantage: row {perm[i]} "
                       f"was {base[perm[i]]:.6g}, became {moved[i]:.6g} (groups taken by position?)")
    return Outcome("permutation", True)


def microbatch_check(aud: Auditor, case) -> List[Outcome]:
    """The gradient accumulated over 2 and 4 micro-batches equals the full batch's."""
    if "microbatch" not in aud.entry.checks or aud.backend != "torch":
        return []
    data, _ = aud.inputs_for(case)
    if data is None:
        return []
    wrt = aud.entry.diff[0]
    B = data[wrt].shape[0]
    hand = aud.reference_vjp(data, 1.0)[wrt]
    m = data["mask"]
    out = []
    for K in (2, 4):
        if B % K or B < K:
            continue
        total = np.zeros(data[wrt].shape)
        size = B // K
        try:
            for k in range(K):
                rows = slice(k * size, (k + 1) * size)
                part = {key: (v[rows] if isinstance(v, np.ndarray) and v.shape[:1] == (B,) else v)
                        for key, v in data.items()}
                extra = dict(n_tokens_global=int(m.sum()),
                             n_sequences_global=int(m.any(axis=1).sum()))
                raw, leaves = aud.call(part, grad_wrt=(wrt,), extra=extra)
                weight = 1.0 / K if aud.accumulation == "mean" else 1.0
                (gr,) = bridge.backprop(raw, weight, [leaves[wrt]])
                if gr is not None:
                    total[rows] = gr
        except Exception as exc:
            out.append(Outcome("microbatch", False, f"{type(exc).__name__}: {exc}"))
            continue
        i = aud.mismatch(total, hand, m.astype(bool))
        if i is not None:
            ratio = total[i] / hand[i] if hand[i] else float("inf")
            out.append(Outcome("microbatch", False,
                               f"{K} micro-batches accumulated ({aud.accumulation} of micro-batch "
                               f"gradients) give d/d{wrt}{list(i)} = {total[i]:.6g}, the full "
                               f"batch {hand[i]:.6g} (×{ratio:.3g})"))
        else:
            out.append(Outcome("microbatch", True))
    return out


def kl_direction_check(aud: Auditor, rng) -> Optional[Outcome]:
    """A small step on the KL term alone, in exact expectation over a softmax policy, moves π
    toward the reference."""
    if "kl_direction" not in aud.entry.checks or aud.backend != "torch":
        return None
    worst = None
    for _ in range(4):
        V = 6
        theta = torch.tensor(rng.normal(0, 0.6, V), requires_grad=True)
        ref = torch.tensor(rng.normal(0, 0.6, V))
        logp = torch.log_softmax(theta, -1)
        ref_logp = torch.log_softmax(ref, -1)
        weights = logp.exp().detach()          # every category once, weighted by π: E_π exactly
        try:
            per_token = aud.invoke(**{k: v for k, v in dict(logp=logp[None], ref_logp=ref_logp[None],
                                                        mask=torch.ones(1, V, dtype=torch.bool)
                                                        ).items() if aud.accepts(k)})
            # None: a detached or grad-free output has no path to θ
            (g,) = bridge.backprop(per_token[0], weights, [theta])
        except Exception as exc:              # the user's code, or what it returned: report it
            return Outcome("kl_direction", False, f"{type(exc).__name__}: {exc}")
        if g is None or float(np.abs(g).max()) < 1e-12:
            return Outcome("kl_direction", True, warn=True,
                           message="your KL term has no expected gradient (k1 used as a loss?): "
                                   "it does not pull π toward the reference")
        with torch.no_grad():
            def sym_kl(t):
                lp = torch.log_softmax(t, -1)
                return float(((lp.exp() - ref_logp.exp()) * (lp - ref_logp)).sum())
            step = torch.from_numpy(g / np.linalg.norm(g))
            before, after = sym_kl(theta), sym_kl(theta - 1e-3 * step)
        if after > before:
            worst = f"a small step on your KL term alone raises KL(π‖ref) + KL(ref‖π) " \
                    f"({before:.6g} → {after:.6g}): is its sign flipped?"
    if worst:
        return Outcome("kl_direction", False, worst)
    return Outcome("kl_direction", True)
