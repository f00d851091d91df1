"""`explain --plot DIR`: figures of the objectives, their gradients, the KL estimators and the
GAE weights, every curve computed by ref_numpy (gradients by its hand VJPs).

matplotlib is an optional extra (`pip install -e ".[plot]"`). Figure text is English in both
languages: a Chinese font is not something matplotlib can be assumed to find.
"""
import os

import numpy as np
from scipy.integrate import cumulative_trapezoid

import ref_numpy

FIGURES = ("ppo_objective.png", "kl_estimators.png", "gae_weights.png", "beyond_ppo.png")
# the figures each topic draws
FIGURES_OF = {"ppo": (FIGURES[0],), "cispo": (FIGURES[0],), "kl": (FIGURES[1],),
              "gae": (FIGURES[2],), "beyond": (FIGURES[3],)}


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable('--plot needs matplotlib, an optional extra: '
                              'pip install -e ".[plot]"') from exc
    return plt


def _objective_and_slope(ratio, fn, A, **kw):
    """(objective −loss, d objective/d ratio) per ratio: the slope from the hand VJP,
    d/dratio = (d/dlogp)/ratio since dratio/dlogp = ratio."""
    logp = np.log(ratio)
    old = np.zeros_like(ratio)
    adv = np.full_like(ratio, A)
    loss = getattr(ref_numpy, fn)(logp, old, adv, **kw)
    grad = getattr(ref_numpy, fn + "_vjp")(np.ones_like(ratio), logp, old, adv, **kw)["logp"]
    return -loss, -grad / ratio


def _save(plt, fig, out_dir, name, paths):
    fig.tight_layout()
    paths.append(os.path.join(out_dir, name))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)


def ready() -> None:
    """Raise PlotUnavailable without matplotlib (the command line checks the folder)."""
    _pyplot()


def write_figures(out_dir: str, topics=None):
    """Write the figures of `topics` (None: every figure) into out_dir; returns their paths."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    wanted = set(FIGURES) if topics is None else {f for t in topics for f in FIGURES_OF.get(t, ())}
    paths = []
    if FIGURES[0] in wanted:
        _objective_figure(plt, out_dir, paths)
    if FIGURES[1] in wanted:
        _estimator_figure(plt, out_dir, paths)
    if FIGURES[2] in wanted:
        _gae_figure(plt, out_dir, paths)
    if FIGURES[3] in wanted:
        _beyond_figure(plt, out_dir, paths)
    return paths


def _objective_figure(plt, out_dir, paths):
    # 1. PPO (A > 0, A < 0), dual clip, CISPO: objective and its slope in the ratio
    r = np.linspace(0.05, 4.0, 800)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = [("PPO, A = +1", "ppo_clip_loss", 1.0, {}, "-"),
              ("PPO, A = −1", "ppo_clip_loss", -1.0, {}, "-"),
              ("PPO dual clip c = 3, A = −1", "ppo_clip_loss", -1.0, {"clip_c": 3.0}, ":")]
    for label, fn, A, kw, style in curves:
        obj, slope = _objective_and_slope(r, fn, A, **kw)
        ax1.plot(r, obj, style, lw=2.2 if style == ":" else 1.5, label=label)
        ax2.plot(r, slope, style, lw=2.2 if style == ":" else 1.5, label=label)
    # CISPO's gradient wrt logp is −sg(w)·A, i.e. a slope w·A/r per unit ratio; its objective is
    # drawn as the surrogate with that slope: the running integral, starting from A·r at r_0
    logp = np.log(r)
    g = ref_numpy.cispo_loss_vjp(np.ones_like(r), np.full_like(r, -1.0), -1.0 - logp,
                                 np.ones_like(r), clip_high=2.0)["logp"]
    slope = -g / r
    surrogate = r[0] + cumulative_trapezoid(slope, r, initial=0.0)
    ax1.plot(r, surrogate, "--", label="CISPO cap 2, A = +1 (surrogate with its gradient)")
    ax2.plot(r, slope, "--", label="CISPO cap 2, A = +1 (w·A/r)")
    for ax, title in ((ax1, "objective min(rA, clip(r)A) vs ratio (ε = 0.2)"),
                      (ax2, "d objective / d ratio (0 where the clip binds)")):
        ax.axvline(0.8, color="grey", lw=0.5)
        ax.axvline(1.2, color="grey", lw=0.5)
        ax.set_xlabel("ratio r = π/π_old")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    _save(plt, fig, out_dir, FIGURES[0], paths)


def _estimator_figure(plt, out_dir, paths):
    # 2. k1, k2, k3 per sample vs u = log(ref/π)
    u = np.linspace(-3, 3, 601)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for kind in ("k1", "k2", "k3"):
        ax.plot(u, ref_numpy.kl_penalty(np.zeros_like(u), u, kind=kind), label=kind)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_ylim(-3, 6)
    ax.set_xlabel("u = log(ref(x)/π(x)) at the sample")
    ax.set_title("per-sample KL estimators: k1 = −u, k2 = u²/2, k3 = e^u − 1 − u", fontsize=10)
    ax.legend()
    _save(plt, fig, out_dir, FIGURES[1], paths)


def _gae_figure(plt, out_dir, paths):
    # 3. GAE weights (γλ)^l = ∂A_0/∂r_l, read off the hand VJP
    T = 40
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for lam in (0.0, 0.5, 0.95, 1.0):
        w = ref_numpy.gae_vjp((np.eye(T)[0], np.zeros(T)), np.zeros(T), np.zeros(T), gamma=0.99,
                              lam=lam)["rewards"]
        ax.plot(np.arange(T), w, marker=".", label=f"λ = {lam}")
    ax.set_xlabel("l (steps ahead)")
    ax.set_ylabel("∂A_0/∂r_l = (γλ)^l")
    ax.set_title("GAE weights, γ = 0.99 (from gae_vjp)", fontsize=10)
    ax.legend()
    _save(plt, fig, out_dir, FIGURES[2], paths)


def _beyond_figure(plt, out_dir, paths):
    # 4. ∂loss/∂logπ against the ratio, per method (one-token sequences, so GSPO is PPO's
    # curve and GMPO's clip is PPO's in log space), from the hand VJPs of the topic's conventions
    from .topics import BEYOND
    r = np.linspace(0.05, 3.0, 600)[:, None]
    logp = np.full_like(r, -1.0)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, A in zip(axes, (1.0, -1.0)):
        for label, fn, params, g in BEYOND:
            if label == "GSPO":
                continue
            cot = np.array(float(len(r))) if g is None else np.ones_like(r)
            grad = getattr(ref_numpy, fn + "_vjp")(cot, logp, logp - np.log(r),
                                                   np.full_like(r, A), **params)["logp"]
            ax.plot(r[:, 0], grad[:, 0], lw=1.4, label=label)
        ax.axvline(0.8, color="grey", lw=0.5)
        ax.axvline(1.2, color="grey", lw=0.5)
        ax.set_xlabel("ratio r = π/π_old (the rollout's for TIS, MIS)")
        ax.set_ylabel("∂loss/∂logπ")
        ax.set_title(f"gradient per token vs ratio, A = {A:+g}", fontsize=10)
        ax.legend(fontsize=8)
    _save(plt, fig, out_dir, FIGURES[3], paths)
