"""`python -m crosscheck explain`: the seed's seven topics and "beyond PPO", every number computed
live.

Each value comes from ref_numpy and is confirmed by ref_torch; each gradient is the hand VJP,
printed beside torch autograd, and the walkthrough raises `WalkthroughError` if any pair ever
disagrees (tolerances: the harness table). Where the MiniMind demo this grew from says something
the numbers contradict, the topic says so ("Correction").

Text lives in `TEXT[lang]`; numbers are computed once per topic, so `--lang en` and `--lang zh`
print the same numbers in the same order.
"""
import dataclasses
import math
import unicodedata
from typing import Dict, List

import numpy as np

from ref_common.vocab import AGG_MODES

from .. import bridge, tolerances
from ..check import finite_diff, registry
from ..check.cases import SEED_P, SEED_Q
from . import TOPICS
from .text import TEXT


class WalkthroughError(AssertionError):
    """A number of the walkthrough disagrees between ref_numpy and ref_torch."""


# ============================================================ computing, confirmed
class Lab:
    """Runs a registry function through both twins and both gradient paths, and confirms them."""

    def __init__(self, entries=None):
        self.entries = entries if entries is not None else registry.build()

    def value(self, name, arrays, params):
        e = self.entries[name]
        ref = bridge.outputs(e.numpy_fn(**arrays, **params), e.outputs)
        twin = bridge.outputs(e.torch_fn(**bridge.to_torch(arrays), **params), e.outputs)
        for key, a, b in zip(e.outputs, ref, twin):
            self._confirm(b, a, "value", f"{name} {key}: ref_torch vs ref_numpy")
        if e.dict_output:
            return dict(zip(e.outputs, ref))
        return tuple(ref) if len(ref) > 1 else ref[0]

    def grad(self, name, arrays, params, g, wrt):
        """(hand VJP, autograd) of ⟨g, name(...)⟩ wrt `wrt`, confirmed equal."""
        e = self.entries[name]
        hand = np.asarray(e.numpy_vjp(g, **arrays, **params)[wrt])
        auto = np.asarray(bridge.autograd_vjp(e.torch_fn, arrays, params, e.diff, g,
                                              e.outputs if e.dict_output else None)[wrt])
        self._confirm(hand, auto, "vjp", f"{name} d/d{wrt}: hand VJP vs autograd")
        return hand, auto

    @staticmethod
    def _confirm(got, expected, stage, what):
        cmp = bridge.compare(got, expected, tolerances.get(stage))
        if not cmp.ok:
            raise WalkthroughError(f"{what} disagree at {cmp.index}: {cmp.got!r} vs "
                                   f"{cmp.expected!r}; the walkthrough stops rather than print "
                                   f"an unconfirmed number")


# ============================================================ text
@dataclasses.dataclass
class Section:
    name: str
    data: Dict[str, object]                     # JSON: inputs, outputs, gradients, ...
    blocks: List[tuple] = dataclasses.field(default_factory=list)

    def say(self, key, **fmt):
        self.blocks.append(("text", key, fmt))

    def table(self, header_keys, rows):
        self.blocks.append(("table", header_keys, rows))


def f4(x):
    return f"{float(x) + 0.0:.4f}"          # + 0.0 turns −0.0 into 0.0


def f6(x):
    return f"{float(x) + 0.0:.6f}"


def render(section: Section, lang: str) -> str:
    text = TEXT[lang]
    out = []
    for block in section.blocks:
        if block[0] == "text":
            _, key, fmt = block
            out.append(text[key].format(**fmt))
        else:
            _, header_keys, rows = block
            headers = [text.get(h, h) for h in header_keys]
            cells = [[text.get(c, c) if isinstance(c, str) and c.startswith("@") else str(c)
                      for c in row] for row in rows]
            out.append(grid(headers, cells))
    return "\n".join(out)


def display_width(text: str) -> int:
    """The columns `text` takes in a terminal: a wide or full-width (CJK) character 2, a
    combining mark or format character 0, any other 1 (Unicode's East Asian Width)."""
    return sum(0 if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def grid(headers, rows):
    """A table aligned by display width (CJK characters count 2)."""
    widths = [max(display_width(str(r[i])) for r in [headers] + rows)
              for i in range(len(headers))]

    def line(cells):
        parts = []
        for c, w in zip(cells, widths):
            pad = " " * (w - display_width(str(c)))
            numeric = str(c).lstrip("−-+").replace(".", "", 1).replace("e", "", 1).isdigit()
            parts.append(pad + str(c) if numeric else str(c) + pad)
        return ("  " + " | ".join(parts)).rstrip()

    rule = "  " + "-+-".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


# ============================================================ topic 1: GAE
SEED_R = np.array([1.0, 0.0, 0.0, 0.0, 0.5])
SEED_V = np.array([0.5, 0.6, 0.4, 0.5, 0.2])
SEED_D = np.array([0, 0, 0, 0, 1])
GAMMA, LAM = 0.99, 0.95


def topic_gae(lab: Lab) -> Section:
    T = len(SEED_R)
    arrays = dict(rewards=SEED_R, values=SEED_V, mask=None, dones=SEED_D, last_value=None)
    delta, _ = lab.value("gae", arrays, dict(gamma=GAMMA, lam=0.0))
    adv, ret = lab.value("gae", arrays, dict(gamma=GAMMA, lam=LAM))
    g = (np.eye(T)[0], np.zeros(T))                      # L = A_0
    dr, dr_auto = lab.grad("gae", arrays, dict(gamma=GAMMA, lam=LAM), g, "rewards")
    dv, dv_auto = lab.grad("gae", arrays, dict(gamma=GAMMA, lam=LAM), g, "values")
    s = Section("gae", dict(
        inputs=dict(rewards=SEED_R.tolist(), values=SEED_V.tolist(), dones=SEED_D.tolist(),
                    gamma=GAMMA, lam=LAM),
        outputs=dict(td_errors=delta.tolist(), advantages=adv.tolist(), returns=ret.tolist()),
        gradients=dict(dA0_drewards=dr.tolist(), dA0_dvalues=dv.tolist())))
    s.say("gae.title")
    s.say("gae.intro", T=T, gamma=GAMMA, lam=LAM, r=_vec(SEED_R, 1), v=_vec(SEED_V, 1),
          d=_vec(SEED_D, 0))
    s.say("gae.step1")
    v_next = np.append(SEED_V[1:], 0.0)
    for t in range(T):
        s.say("gae.delta_line", t=t, r=f"{SEED_R[t]:.3f}", g=GAMMA, vn=f"{v_next[t]:.3f}",
              c=f"{1 - SEED_D[t]:.0f}", v=f"{SEED_V[t]:.3f}", d=f4(delta[t]))
    s.say("gae.step2")
    gl = GAMMA * LAM
    for t in range(T):
        terms = " + ".join(f"{gl ** l:.4f}·({delta[t + l]:.4f})" for l in range(T - t))
        s.say("gae.adv_line", t=t, terms=terms, a=f4(adv[t]))
    s.say("gae.returns", ret=_vec(ret, 4))
    s.say("gae.grad_intro")
    rows = [[t, f4(SEED_R[t]), f4(SEED_V[t]), f4(delta[t]), f4(adv[t]), f4(ret[t]), f6(dr[t]),
             f6(dr_auto[t]), f6(dv[t]), f6(dv_auto[t])] for t in range(T)]
    s.table(["t", "r_t", "V_t", "δ_t", "A_t", "@returns", "@dA0dr_hand", "@autograd",
             "@dA0dV_hand", "@autograd"], rows)
    s.say("gae.why", gl=f4(gl), one_minus=f4(GAMMA * (1 - LAM)))
    return s


def _vec(x, nd):
    return "[" + ", ".join(f"{float(v):.{nd}f}" for v in x) + "]"


# ============================================================ topic 2: whitening
def topic_whiten(lab: Lab) -> Section:
    adv, _ = lab.value("gae", dict(rewards=SEED_R, values=SEED_V, mask=None, dones=SEED_D,
                                   last_value=None), dict(gamma=GAMMA, lam=LAM))
    params = dict(ddof=0, eps=1e-8, eps_mode="var", shift_mean=True)
    y = lab.value("whiten", dict(x=adv, mask=None), params)
    N = len(adv)
    mean, var = adv.mean(), ((adv - adv.mean()) ** 2).mean()
    s_ = math.sqrt(var + 1e-8)
    hand, auto = lab.grad("whiten", dict(x=adv, mask=None), params, np.eye(N)[0], "x")
    closed = (np.eye(N)[0] - (1 + y[0] * y) / N) / s_
    s = Section("whiten", dict(
        inputs=dict(x=adv.tolist(), **params),
        outputs=dict(mean=mean, var=var, std=math.sqrt(var), whitened=y.tolist(),
                     whitened_mean=float(y.mean()), whitened_var=float(((y - y.mean()) ** 2).mean())),
        gradients=dict(dy0_dx=hand.tolist())))
    s.say("whiten.title")
    s.say("whiten.stats", mean=f4(mean), var=f4(var), std=f4(math.sqrt(var)))
    s.say("whiten.result", y=_vec(y, 4))
    s.say("whiten.check", m=f"{y.mean():.2e}", v=f6(((y - y.mean()) ** 2).mean()))
    s.say("whiten.grad_intro")
    rows = [[i, f4(adv[i]), f4(y[i]), f6(hand[i]), f6(auto[i]), f6(closed[i])] for i in range(N)]
    s.table(["i", "A_i", "y_i", "@dy0dx_hand", "@autograd", "@closed_form"], rows)
    s.say("whiten.why", total=f"{hand.sum():.1e}")
    return s


# ============================================================ topic 3: PPO clip
OLD = np.full(4, -1.0)
NEW = np.array([-0.5, -0.9, -1.3, -2.5])


def _ppo_rows(lab, logp, old, adv, params):
    arrays = dict(logp=logp, old_logp=old, advantages=adv, mask=None)
    loss = lab.value("ppo_clip_loss", arrays, params)
    hand, auto = lab.grad("ppo_clip_loss", arrays, params, np.ones(len(logp)), "logp")
    ratio = np.exp(logp - old)
    lo, hi = 1 - params.get("clip_low", 0.2), 1 + params.get("clip_low", 0.2)
    tokens = []
    for i in range(len(logp)):
        binding = bool(hand[i] == 0.0 and adv[i] != 0.0)
        c = params.get("clip_c")
        if adv[i] > 0:
            why = "@why.pos_bind" if binding else ("@why.pos_low" if ratio[i] < lo else "@why.inside")
        elif c is not None and ratio[i] > c:
            why = "@why.dual_bind"
        else:
            why = "@why.neg_bind" if binding else ("@why.neg_high" if ratio[i] > hi else "@why.inside")
        tokens.append(dict(ratio=float(ratio[i]), clipped_ratio=float(np.clip(ratio[i], lo, hi)),
                           loss=float(loss[i]), grad_logp=float(hand[i]),
                           grad_logp_autograd=float(auto[i]), clip_binding=binding,
                           advantage=float(adv[i]), why=why))
    return loss, tokens


def topic_ppo(lab: Lab) -> Section:
    A = np.ones(4)
    loss, tokens = _ppo_rows(lab, NEW, OLD, A, dict(clip_low=0.2))
    mean = lab.value("aggregate", dict(loss=loss, mask=np.ones(4, dtype=bool)),
                     dict(mode="token-mean", norm=None, empty_rows="exclude"))
    dual_r = np.array([0.5, 1.5, 2.5, 4.0])
    dual_loss, dual_tokens = _ppo_rows(lab, np.log(dual_r), np.zeros(4), -np.ones(4),
                                       dict(clip_low=0.2, clip_c=3.0))
    s = Section("ppo", dict(
        inputs=dict(old_logp=OLD.tolist(), logp=NEW.tolist(), advantages=A.tolist(),
                    clip_low=0.2, dual=dict(ratio=dual_r.tolist(), advantages=[-1.0] * 4,
                                            clip_c=3.0)),
        outputs=dict(loss=loss.tolist(), token_mean=float(mean), dual_loss=dual_loss.tolist()),
        gradients=dict(grad_logp=[t["grad_logp"] for t in tokens],
                       dual_grad_logp=[t["grad_logp"] for t in dual_tokens]),
        tokens=tokens, dual_tokens=dual_tokens))
    s.say("ppo.title")
    s.say("ppo.intro")
    rows = [[i, f"{OLD[i]:.3f}", f"{NEW[i]:.3f}", f"{t['ratio']:.4f}", f"{t['clipped_ratio']:.4f}",
             f4(-t["loss"]), f4(t["loss"]), "@yes" if t["clip_binding"] else "@no",
             f4(t["grad_logp"]), f4(t["grad_logp_autograd"]), t["why"]]
            for i, t in enumerate(tokens)]
    s.table(["@token", "logπ_old", "logπ_new", "ratio", "clip(ratio)", "@objective", "loss",
             "@binding", "@dldlogp_hand", "@autograd", "@why"], rows)
    s.say("ppo.mean", m=f4(mean))
    s.say("ppo.case_split")
    r = [t["ratio"] for t in tokens]
    s.say("ppo.corrections", r2=f"{r[2]:.4f}", r3=f"{r[3]:.4f}", g2=f4(tokens[2]["grad_logp"]),
          g3=f4(tokens[3]["grad_logp"]))
    s.say("ppo.dual_intro")
    rows = [[i, f"{t['ratio']:.4f}", "−1", f4(t["loss"]), "@yes" if t["clip_binding"] else "@no",
             f4(t["grad_logp"]), f4(t["grad_logp_autograd"]), t["why"]]
            for i, t in enumerate(dual_tokens)]
    s.table(["@token", "ratio", "A", "loss", "@binding", "@dldlogp_hand", "@autograd", "@why"],
            rows)
    return s


# ============================================================ topic 4: GRPO
GRPO_R = np.array([0.8, 0.4, 0.6, 0.2, 0.1, 0.3, 0.9, 0.5])
LENGTHS = np.array([3, 1, 2, 4, 2, 2, 1, 3])
MODES = AGG_MODES


def topic_grpo(lab: Lab) -> Section:
    params = dict(group_size=4, group_ids=None, ddof=0, eps=1e-4, scale="group", baseline="mean")
    adv = lab.value("group_advantages", dict(rewards=GRPO_R, group_ids=None),
                    {k: v for k, v in params.items() if k != "group_ids"})
    groups = GRPO_R.reshape(2, 4)
    B, T = len(GRPO_R), int(LENGTHS.max())
    mask = np.arange(T)[None, :] < LENGTHS[:, None]
    logp = np.where(mask, -1.0 - 0.1 * np.arange(T)[None, :], 0.0)
    arrays = dict(logp=logp, old_logp=logp.copy(), advantages=adv, mask=mask, ref_logp=None)
    obj_params = dict(loss="ppo", agg="seq-mean-token-mean", beta=0.0)
    value = lab.value("policy_objective", arrays, obj_params)
    hand, auto = lab.grad("policy_objective", arrays, obj_params, 1.0, "logp")
    weights = {}
    for mode in MODES:
        w, _ = lab.grad("aggregate", dict(loss=np.zeros((B, T)), mask=mask),
                        dict(mode=mode, norm=None, empty_rows="exclude"), 1.0, "loss")
        weights[mode] = w[:, 0].tolist()
    s = Section("grpo", dict(
        inputs=dict(rewards=GRPO_R.tolist(), group_size=4, ddof=0, eps=1e-4,
                    lengths=LENGTHS.tolist()),
        outputs=dict(group_mean=groups.mean(1).tolist(), group_std=groups.std(1).tolist(),
                     advantages=adv.tolist(), group_sums=adv.reshape(2, 4).sum(1).tolist(),
                     loss_at_ratio_one=float(value), token_weights=weights),
        gradients=dict(grad_logp_first_token=hand[:, 0].tolist())))
    s.say("grpo.title")
    s.say("grpo.intro")
    s.table(["@group", "@rewards", "@mean", "@std"],
            [[k + 1, _vec(groups[k], 1), f4(groups[k].mean()), f4(groups[k].std())]
             for k in range(2)])
    s.say("grpo.adv", a=_vec(adv, 4), s1=f"{adv[:4].sum():.1e}", s2=f"{adv[4:].sum():.1e}")
    s.say("grpo.zero_loss", v=f4(value))
    s.table(["@response", "r_i", "A_i", "L_i", "@dldlogp_hand", "@autograd"],
            [[i, f"{GRPO_R[i]:.1f}", f4(adv[i]), LENGTHS[i], f6(hand[i, 0]), f6(auto[i, 0])]
             for i in range(B)])
    s.say("grpo.zero_why")
    s.say("grpo.weights_intro")
    s.table(["@response", "L_i"] + list(MODES),
            [[i, LENGTHS[i]] + [f4(weights[m][i]) for m in MODES] for i in range(B)])
    s.say("grpo.weights_why", n=int(LENGTHS.sum()), B=B, T=T)
    return s


# ============================================================ topic 5: CISPO vs PPO
CISPO_R = np.array([0.3, 0.9, 1.5, 3.0, 5.0])


def topic_cispo(lab: Lab) -> Section:
    logp = np.full(5, -0.5)
    old = logp - np.log(CISPO_R)
    A = np.ones(5)
    arrays = dict(logp=logp, old_logp=old, advantages=A, mask=None)
    ppo_loss = lab.value("ppo_clip_loss", arrays, dict(clip_low=0.2))
    ppo_g, ppo_auto = lab.grad("ppo_clip_loss", arrays, dict(clip_low=0.2), np.ones(5), "logp")
    cis_params = dict(clip_high=2.0)
    cis_g, cis_auto = lab.grad("cispo_loss", arrays, cis_params, np.ones(5), "logp")
    e = lab.entries["cispo_loss"]
    undetached = []
    for i in range(5):          # d value / d logp_i: the gradient had w not been detached
        def phi(t, i=i):
            lp = logp.copy()
            lp[i] += t
            return float(e.numpy_fn(lp, old, A, None, **cis_params)[i])
        undetached.append(finite_diff.directional(
            lambda ts, phi=phi: np.array([phi(float(t)) for t in ts]), 1e-3))
    tokens = []
    for i in range(5):
        tokens.append(dict(
            ratio=float(CISPO_R[i]), ppo_clipped_ratio=float(np.clip(CISPO_R[i], 0.8, 1.2)),
            ppo_effective_ratio=float(-ppo_loss[i]), ppo_grad_logp=float(ppo_g[i]),
            ppo_clip_binding=bool(ppo_g[i] == 0.0), cispo_weight=float(-cis_g[i]),
            grad_logp=float(cis_g[i]), grad_logp_autograd=float(cis_auto[i]),
            clip_binding=bool(cis_g[i] == 0.0), undetached_grad_logp=undetached[i]))
    s = Section("cispo", dict(
        inputs=dict(ratio=CISPO_R.tolist(), advantages=A.tolist(), logp=logp.tolist(),
                    ppo_clip_low=0.2, cispo_clip_high=2.0, cispo_bound="absolute"),
        outputs=dict(ppo_effective_ratio=[t["ppo_effective_ratio"] for t in tokens],
                     cispo_weight=[t["cispo_weight"] for t in tokens]),
        gradients=dict(ppo_grad_logp=ppo_g.tolist(), cispo_grad_logp=cis_g.tolist()),
        tokens=tokens))
    s.say("cispo.title")
    s.say("cispo.intro")
    s.table(["ratio", "@ppo_clip", "@ppo_eff", "@ppo_grad", "@autograd", "@ppo_bind", "@cispo_w",
             "@cispo_grad", "@autograd", "@cispo_bind", "@undetached"],
            [[f"{t['ratio']:.1f}", f4(t["ppo_clipped_ratio"]), f4(t["ppo_effective_ratio"]),
              f4(t["ppo_grad_logp"]), f4(ppo_auto[i]), "@yes" if t["ppo_clip_binding"] else "@no",
              f4(t["cispo_weight"]), f4(t["grad_logp"]), f4(t["grad_logp_autograd"]),
              "@yes" if t["clip_binding"] else "@no", f4(t["undetached_grad_logp"])]
             for i, t in enumerate(tokens)])
    s.say("cispo.why")
    s.say("cispo.corrections", g0=f4(ppo_g[0]), w3=f4(cis_g[3]), w4=f4(cis_g[4]))
    return s


# ============================================================ topic 6: KL estimators
def _follows(g):
    if np.abs(g["expected"]).max() < 1e-12:
        return "@follows.zero"
    if np.abs(g["expected"] - g["grad_kl_forward"]).max() < 1e-12:
        return "@follows.forward"
    if np.abs(g["expected"] - g["grad_kl_reverse"]).max() < 1e-12:
        return "@follows.reverse"
    return "@follows.neither"


def topic_kl(lab: Lab) -> Section:
    logp, logq = np.log(SEED_P), np.log(SEED_Q)
    ks, dks = {}, {}
    for kind in ("k1", "k2", "k3"):
        arrays = dict(logp=logp, ref_logp=logq, mask=None)
        ks[kind] = lab.value("kl_penalty", arrays, dict(kind=kind, clamp=None))
        dks[kind] = lab.grad("kl_penalty", arrays, dict(kind=kind, clamp=None), np.ones(4),
                             "logp")[0]
    z = dict(logits=logp, ref_logits=logq)
    moments = {k: lab.value("kl_estimator_moments", z, dict(kind=k)) for k in ("k1", "k2", "k3")}
    uniform = np.zeros(4)
    plan = [(k, u, None, None) for k in ("k1", "k2", "k3") for u in ("loss", "reward")] + \
        [("k3", "loss", uniform, w) for w in (None, "detached", "attached")]
    rows, grads = [], []
    for kind, use, zs, w in plan:
        g = lab.value("kl_estimator_gradient", dict(z, sample_logits=zs),
                      dict(kind=kind, use=use, is_weight=w))
        follows = _follows(g)
        grads.append(dict(kind=kind, use=use, samples="pi" if zs is None else "uniform",
                          is_weight=w, expected=g["expected"].tolist(), follows=follows[9:]))
        rows.append([kind, f"@use.{use}", "@samples.pi" if zs is None else "@samples.uniform",
                     "-" if w is None else f"@w.{w}", _vec(g["expected"], 4), follows])
    g0 = lab.value("kl_estimator_gradient", dict(z, sample_logits=None), dict(kind="k1"))
    far = {k: lab.value("kl_estimator_moments",
                        dict(logits=np.log([0.99, 0.01]), ref_logits=np.log([0.01, 0.99])),
                        dict(kind=k))["var"] for k in ("k1", "k3")}
    s = Section("kl", dict(
        inputs=dict(p=SEED_P.tolist(), q=SEED_Q.tolist()),
        outputs=dict(per_sample={k: v.tolist() for k, v in ks.items()},
                     moments=moments, far_apart_var=far,
                     grad_kl_forward=g0["grad_kl_forward"].tolist(),
                     grad_kl_reverse=g0["grad_kl_reverse"].tolist()),
        gradients=dict(dk_dlogp={k: v.tolist() for k, v in dks.items()}, expected=grads)))
    s.say("kl.title")
    s.say("kl.intro", p=_vec(SEED_P, 2), q=_vec(SEED_Q, 2))
    s.table(["x", "p", "q", "k1", "k2", "k3", "∂k1/∂logπ", "∂k2/∂logπ", "∂k3/∂logπ"],
            [[x, f"{SEED_P[x]:.2f}", f"{SEED_Q[x]:.2f}", f4(ks["k1"][x]), f4(ks["k2"][x]),
              f4(ks["k3"][x]), f4(dks["k1"][x]), f4(dks["k2"][x]), f4(dks["k3"][x])]
             for x in range(4)])
    s.say("kl.per_sample_why")
    s.say("kl.moments_intro", kf=f6(moments["k1"]["kl_forward"]),
          kr=f6(moments["k1"]["kl_reverse"]))
    s.table(["@estimator", "E_p[k]", "@bias", "Var"],
            [[k, f6(m["mean"]), f6(m["bias"]), f6(m["var"])] for k, m in moments.items()])
    s.say("kl.grad_intro", fwd=_vec(g0["grad_kl_forward"], 4), rev=_vec(g0["grad_kl_reverse"], 4))
    s.table(["@estimator", "@used_as", "@samples", "@is_weight", "@expected_grad", "@follows"],
            rows)
    s.say("kl.corrections", v1=f"{far['k1']:.3f}", v3=f"{far['k3']:.1f}")
    return s


# ============================================================ topic 7: PPO vs GRPO
def topic_compare(lab: Lab) -> Section:
    r = np.array([1.0, 0.0, 0.0, 0.0])
    a_biased = lab.value("group_advantages", dict(rewards=r, group_ids=None),
                         dict(group_size=4, ddof=0, eps=1e-4))
    a_unbiased = lab.value("group_advantages", dict(rewards=r, group_ids=None),
                           dict(group_size=4, ddof=1, eps=1e-4))
    s = Section("compare", dict(
        inputs=dict(rewards=r.tolist()),
        outputs=dict(minimind_A0=float(a_biased[0]), trl_A0=float(a_unbiased[0])),
        gradients={}))
    s.say("compare.title")
    rows = [[f"@cmp.{k}", f"@cmp.{k}.ppo", f"@cmp.{k}.grpo"] for k in
            ("critic", "baseline", "advantage", "clip", "kl", "first_loss", "early_stop",
             "memory")]
    s.table(["@cmp.dimension", "PPO", "GRPO"], rows)
    s.say("compare.numbers", b=f4(a_biased[0]), u=f4(a_unbiased[0]))
    return s


# ============================================================ topic 8: beyond PPO
BEYOND_R = np.array([0.5, 0.9, 1.0, 1.3, 2.5])
# (column, registry function, conventions, cotangent per token): each method's gradient
# wrt logπ of the one sequence's loss (GSPO's per-token copies of its sequence loss are
# averaged, GMPO's loss is the sequence's already)
BEYOND = (("PPO", "ppo_clip_loss", dict(clip_low=0.2), 1.0),
          ("CISPO", "cispo_loss", dict(bound="relative", clip_low=0.2, clip_high=0.2), 1.0),
          ("GSPO", "gspo_loss", dict(clip_low=0.2, clip_high=0.2, form="sequence"), 0.2),
          ("SAPO", "sapo_loss", dict(tau_pos=1.0, tau_neg=1.05), 1.0),
          ("GMPO", "gmpo_loss", dict(clip_low=0.2, clip_high=0.2), None),
          ("TIS", "reinforce_loss", dict(is_level="token", is_upper=2.0), 1.0),
          ("MIS", "reinforce_loss", dict(is_level="token", is_mode="mask", is_upper=2.0), 1.0))


def topic_beyond(lab: Lab) -> Section:
    logp = np.full((1, 5), -1.0)
    old = logp - np.log(BEYOND_R)[None, :]
    data = {}
    s = Section("beyond", {})
    s.say("beyond.title")
    s.say("beyond.intro")
    outputs = {}
    for A in (1.0, -1.0):
        arrays = dict(logp=logp, old_logp=old, advantages=np.full((1, 5), A),
                      mask=np.ones((1, 5), bool))
        sign = "+1" if A > 0 else "-1"
        # the sequence ratios the two sequence-level methods judge (loss = −A·ratio)
        outputs[f"gspo_sequence_ratio_A={sign}"] = float(-lab.value(
            "gspo_loss", arrays, dict(BEYOND[2][2]))[0, 0] / A)
        outputs[f"gmpo_sequence_ratio_A={sign}"] = float(-lab.value(
            "gmpo_loss", arrays, dict(BEYOND[4][2])) / A)
        cols = {}
        for label, fn, params, g in BEYOND:
            cot = np.array(1.0) if g is None else np.full((1, 5), g)
            hand, _ = lab.grad(fn, arrays, params, cot, "logp")
            cols[label] = hand.reshape(-1)
        data["A=+1" if A > 0 else "A=-1"] = {k: v.tolist() for k, v in cols.items()}
        s.say("beyond.pos" if A > 0 else "beyond.neg")
        s.table(["ratio"] + [c[0] for c in BEYOND],
                [[f"{BEYOND_R[i]:.1f}"] + [f4(cols[c[0]][i]) for c in BEYOND] for i in range(5)])
    s.say("beyond.why")
    s.data = dict(inputs=dict(ratio=BEYOND_R.tolist(), logp=-1.0, advantages=[1.0, -1.0],
                              conventions={c[0]: dict(function=c[1], **c[2]) for c in BEYOND}),
                  outputs=outputs, gradients=data)
    return s


BUILDERS = dict(gae=topic_gae, whiten=topic_whiten, ppo=topic_ppo, grpo=topic_grpo,
                cispo=topic_cispo, kl=topic_kl, compare=topic_compare, beyond=topic_beyond)


def walkthrough(topics=TOPICS, entries=None) -> List[Section]:
    lab = Lab(entries)
    return [BUILDERS[t](lab) for t in topics]


def to_text(sections: List[Section], lang: str) -> str:
    return "\n\n".join(render(s, lang) for s in sections) + "\n"


def _words(v):
    """The JSON's text in English: '@key' cells of the string table become their words."""
    if isinstance(v, str) and v.startswith("@") and v in TEXT["en"]:
        return TEXT["en"][v]
    if isinstance(v, dict):
        return {k: _words(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_words(x) for x in v]
    return v


def to_json_doc(sections: List[Section]) -> Dict[str, object]:
    return {"topics": [_words(bridge.json_safe(dict(name=s.name, **s.data))) for s in sections]}
