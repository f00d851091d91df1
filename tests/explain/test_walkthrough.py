"""The walkthrough: the seed's values, each corrected fact, both languages, figures, loud failure.

Facts are read from the walkthrough's own data (what it prints), and each is pinned against a
value derived here by hand.
"""
import builtins
import dataclasses
import json
import math
import re

import numpy as np
import pytest

import ref_numpy
from crosscheck.check import registry
from crosscheck.explain import topics as explain
from tests.helpers import run_cli


@pytest.fixture
def topics():
    # Function scope (0.1 s each): mutation testing credits a function to the tests that run
    # it, and a module-scoped fixture would run the walkthrough inside the first test only.
    return {s.name: s for s in explain.walkthrough()}


def data(topics, name):
    return topics[name].data


# ---------------------------------------------------------------- the seed's values
def test_seed_values_are_reproduced(topics):
    gae = data(topics, "gae")["outputs"]
    np.testing.assert_allclose(gae["advantages"], [0.9697, -0.1322, 0.0763, -0.0198, 0.3000],
                               atol=0.5e-4)
    np.testing.assert_allclose(gae["td_errors"], [1.0940, -0.2040, 0.0950, -0.3020, 0.3000],
                               atol=0.5e-4)
    w = data(topics, "whiten")["outputs"]
    np.testing.assert_allclose([w["mean"], w["var"], w["std"]], [0.2388, 0.1538, 0.3921],
                               atol=0.5e-4)
    np.testing.assert_allclose(w["whitened"], [1.8638, -0.9461, -0.4143, -0.6596, 0.1561],
                               atol=0.5e-4)
    ppo = data(topics, "ppo")["outputs"]
    np.testing.assert_allclose(ppo["loss"], [-1.2000, -1.1052, -0.7408, -0.2231], atol=0.5e-4)
    assert abs(ppo["token_mean"] - -0.8173) < 0.5e-4
    np.testing.assert_allclose(data(topics, "grpo")["outputs"]["advantages"][:2],
                               [1.3410409688949585, -0.44701361656188965], atol=1e-6)
    m = data(topics, "kl")["outputs"]["moments"]
    assert abs(m["k1"]["kl_forward"] - 0.025267) < 0.5e-6
    assert abs(m["k1"]["var"] - 0.049086) < 0.5e-6 and abs(m["k3"]["var"] - 0.000255) < 0.5e-6


def test_gae_gradient_table_matches_the_closed_form(topics):
    # ∂A_0/∂r_t = (γλ)^t; ∂A_0/∂V_0 = −1; ∂A_0/∂V_t = (γλ)^(t−1)·γ(1 − λ) for t ≥ 1
    g = data(topics, "gae")["gradients"]
    gl, gamma, lam = 0.99 * 0.95, 0.99, 0.95
    np.testing.assert_allclose(g["dA0_drewards"], [gl ** t for t in range(5)], rtol=1e-12)
    np.testing.assert_allclose(g["dA0_dvalues"],
                               [-1.0] + [gl ** (t - 1) * gamma * (1 - lam) for t in range(1, 5)],
                               rtol=1e-12)


def test_whitening_gradient_sums_to_zero(topics):
    assert abs(sum(data(topics, "whiten")["gradients"]["dy0_dx"])) < 1e-12


# ---------------------------------------------------------------- corrected facts
def test_only_token_0_of_the_ppo_table_is_clipped(topics):
    tokens = data(topics, "ppo")["tokens"]
    assert [t["clip_binding"] for t in tokens] == [True, False, False, False]
    # tokens 2 and 3 are below 0.8 yet keep the gradient −r (A = 1): the clip does not bind
    for i, rho in ((2, -0.3), (3, -1.5)):
        assert tokens[i]["ratio"] < 0.8
        assert tokens[i]["grad_logp"] == pytest.approx(-math.exp(rho), rel=1e-12)


def test_token_ratios_are_what_the_seed_misprints(topics):
    tokens = data(topics, "ppo")["tokens"]
    assert tokens[3]["ratio"] == pytest.approx(math.exp(-1.5), rel=1e-12)    # 0.2231, not 0.37
    assert abs(tokens[3]["ratio"] - 0.37) > 0.1
    assert not 0.8 <= tokens[2]["ratio"] <= 1.2                              # 0.7408: outside


def test_clip_binding_is_exactly_where_the_gradient_is_zero(topics):
    for key in ("tokens", "dual_tokens"):
        for t in data(topics, "ppo")[key]:
            assert t["clip_binding"] == (t["grad_logp"] == 0.0 and t["advantage"] != 0.0)
    assert [t["clip_binding"] for t in data(topics, "ppo")["dual_tokens"]] == \
        [True, False, False, True]          # r = 0.5 (lower edge, A < 0) and r = 4 > c = 3


def test_ppo_does_not_limit_a_decrease_when_a_is_positive(topics):
    t0 = data(topics, "cispo")["tokens"][0]                     # ratio 0.3, A = +1
    assert t0["ppo_effective_ratio"] == pytest.approx(0.3, rel=1e-12)   # not 0.8
    assert t0["ppo_grad_logp"] == pytest.approx(-0.3, rel=1e-12)
    assert t0["ppo_clip_binding"] is False


def test_cispo_keeps_the_gradient_of_clipped_tokens(topics):
    tokens = data(topics, "cispo")["tokens"]
    assert [t["ppo_clip_binding"] for t in tokens] == [False, False, True, True, True]
    assert [t["clip_binding"] for t in tokens] == [False] * 5
    for t in tokens:                                        # −min(r, 2)·A
        assert t["grad_logp"] == pytest.approx(-min(t["ratio"], 2.0), rel=1e-12)
    # without the detach the gradient would be −A·(w + logπ·r·1[r < cap]); logπ = −0.5
    for t in tokens:
        expected = -(min(t["ratio"], 2.0) + (-0.5 * t["ratio"] if t["ratio"] < 2.0 else 0.0))
        assert t["undetached_grad_logp"] == pytest.approx(expected, rel=1e-8, abs=1e-10)


def test_grpo_loss_is_zero_at_ratio_one_but_its_gradient_is_not(topics):
    d = data(topics, "grpo")
    assert abs(d["outputs"]["loss_at_ratio_one"]) < 1e-15
    g = np.array(d["gradients"]["grad_logp_first_token"])
    A = np.array(d["outputs"]["advantages"])
    L = np.array(d["inputs"]["lengths"])
    np.testing.assert_allclose(g, -A / (L * len(A)), rtol=1e-12)     # −A_i/(L_i·B)
    assert np.abs(g).min() > 1e-3


def test_aggregation_weights_show_the_length_bias(topics):
    d = data(topics, "grpo")
    L = np.array(d["inputs"]["lengths"])
    w = d["outputs"]["token_weights"]
    np.testing.assert_allclose(w["token-mean"], 1 / L.sum(), rtol=1e-12)
    np.testing.assert_allclose(w["seq-mean-token-mean"], 1 / (L * len(L)), rtol=1e-12)
    np.testing.assert_allclose(w["seq-mean-token-sum"], 1 / len(L), rtol=1e-12)
    np.testing.assert_allclose(w["seq-mean-token-sum-norm"], 1 / L.max(), rtol=1e-12)


def test_which_divergence_each_estimator_follows(topics):
    rows = {(g["kind"], g["use"], g["samples"], g["is_weight"]): g["follows"]
            for g in data(topics, "kl")["gradients"]["expected"]}
    assert rows[("k1", "loss", "pi", None)] == "zero"
    assert rows[("k1", "reward", "pi", None)] == "forward"
    assert rows[("k2", "loss", "pi", None)] == "forward"
    assert rows[("k3", "loss", "pi", None)] == "reverse"
    assert rows[("k3", "loss", "uniform", None)] == "neither"
    assert rows[("k3", "loss", "uniform", "detached")] == "reverse"
    assert rows[("k3", "loss", "uniform", "attached")] == "forward"


def test_k3_variance_claim_is_refuted(topics):
    far = data(topics, "kl")["outputs"]["far_apart_var"]
    assert far["k3"] > 10 * far["k1"]


def test_std_convention_numbers(topics):
    out = data(topics, "compare")["outputs"]
    assert out["minimind_A0"] == pytest.approx(0.75 / (math.sqrt(3) / 4 + 1e-4), rel=1e-12)
    assert out["trl_A0"] == pytest.approx(0.75 / (0.5 + 1e-4), rel=1e-12)


# ---------------------------------------------------------------- languages and layout
DECIMAL = re.compile(r"\d+\.\d+(?:e[-+]?\d+)?")


def test_both_languages_print_the_same_numbers(topics):
    sections = list(topics.values())
    en, zh = explain.to_text(sections, "en"), explain.to_text(sections, "zh")
    assert en != zh
    assert DECIMAL.findall(en) == DECIMAL.findall(zh)
    assert len(DECIMAL.findall(en)) > 300


def test_zh_tables_align_by_display_width(topics):
    wcswidth = pytest.importorskip("wcwidth").wcswidth     # an independent display width
    text = explain.to_text(list(topics.values()), "zh")
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("  ") and (" | " in line or "-+-" in line):
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    def columns(line):            # display-width positions of the column separators
        return [wcswidth(line[:m.start() + 1]) for m in re.finditer(r" \| |-\+-", line)]

    assert len(blocks) >= 10
    for block in blocks:
        assert len({tuple(columns(line)) for line in block}) == 1, block[0]
    assert any(wcswidth(line) > len(line) for b in blocks for line in b)   # CJK was present


# ---------------------------------------------------------------- failing loudly, CLI, figures
def test_walkthrough_stops_when_hand_and_autograd_disagree():
    entries = registry.build()

    def wrong_vjp(g, *a, **k):
        good = ref_numpy.ppo_clip_loss_vjp(g, *a, **k)
        return {"logp": good["logp"] * 1.001}

    entries["ppo_clip_loss"] = dataclasses.replace(entries["ppo_clip_loss"], numpy_vjp=wrong_vjp)
    with pytest.raises(explain.WalkthroughError, match="ppo_clip_loss d/dlogp: hand VJP vs "
                                                       "autograd disagree"):
        explain.walkthrough(("ppo",), entries=entries)


def run(argv):
    return run_cli(argv)


def test_cli_topic_and_json():
    code, out, _ = run(["explain", "--json", "--topic", "ppo"])
    assert code == 0
    doc = json.loads(out)
    assert [t["name"] for t in doc["topics"]] == ["ppo"]
    for t in doc["topics"][0]["tokens"]:
        assert {"ratio", "grad_logp", "clip_binding"} <= set(t)
    code, out, _ = run(["explain", "--topic", "kl", "--lang", "zh"])
    assert code == 0 and "KL 估计器" in out
    code, out, _ = run(["explain", "--json"])                 # every topic (kl's 0-d arrays)
    assert code == 0
    assert [t["name"] for t in json.loads(out)["topics"]] == list(explain.TOPICS)
    code, _, err = run(["explain", "--topic", "nonesuch"])
    assert code == 2 and "invalid choice: 'nonesuch'" in err


def test_explain_runs_without_the_wcwidth_package(monkeypatch):
    import sys

    import crosscheck.explain as package
    monkeypatch.setitem(sys.modules, "wcwidth", None)          # `import wcwidth` fails
    monkeypatch.delattr(package, "topics")                      # imported afresh, then restored
    monkeypatch.delitem(sys.modules, "crosscheck.explain.topics")
    code, out, err = run(["explain", "--topic", "kl", "--lang", "zh"])
    assert code == 0 and "KL 估计器" in out and "Traceback" not in err
    grid = sys.modules["crosscheck.explain.topics"].grid
    # 优势 is two wide characters (4 columns), é one column written as e + a combining accent
    lines = grid(["优势", "x"], [["1", "e\u0301"], ["22", "ab"]]).splitlines()
    assert lines == ["  优势 | x", "  -----+---", "     1 | e\u0301", "    22 | ab"]


def test_cli_exits_1_when_the_walkthrough_stops(monkeypatch):
    real = registry.build

    def broken():
        entries = real()
        e = entries["gae"]
        entries["gae"] = dataclasses.replace(
            e, torch_fn=lambda *a, **k: tuple(x * 1.01 for x in e.torch_fn(*a, **k)))
        return entries

    monkeypatch.setattr(registry, "build", broken)
    code, _, err = run(["explain", "--topic", "gae"])
    assert code == 1 and "walkthrough stopped" in err


def test_plot_writes_the_figures_of_the_topics_shown(tmp_path):
    code, _, err = run(["explain", "--topic", "gae", "--plot", str(tmp_path)])
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gae_weights.png"]
    code, _, err = run(["explain", "--topic", "grpo", "--plot", str(tmp_path / "g")])
    assert code == 0 and list((tmp_path / "g").iterdir()) == []
    assert "no figure belongs to topic grpo" in err
    code, _, err = run(["explain", "--plot", str(tmp_path / "all")])
    assert code == 0
    for name in ("ppo_objective.png", "kl_estimators.png", "gae_weights.png"):
        data_ = (tmp_path / "all" / name).read_bytes()
        assert data_[:8] == b"\x89PNG\r\n\x1a\n" and len(data_) > 10_000
        assert f"wrote {tmp_path / 'all' / name}" in err


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, _, err = run(["explain", "--topic", "gae", "--plot", str(tmp_path)])
    assert code == 2
    assert 'pip install -e ".[plot]"' in err


# ---------------------------------------------------------------- text and JSON contracts
def test_every_text_key_and_header_resolves_in_both_languages(topics):
    """Each sentence key exists in both string tables, and no table header is left as a raw
    '@key' (render falls back to the key itself for plain symbols such as r_t)."""
    from crosscheck.explain.text import TEXT
    for section in topics.values():
        for block in section.blocks:
            if block[0] == "text":
                assert block[1] in TEXT["en"] and block[1] in TEXT["zh"], block[1]
            else:
                for h in block[1]:
                    assert not h.startswith("@") or (h in TEXT["en"] and h in TEXT["zh"]), h
        for lang in ("en", "zh"):
            out = explain.render(section, lang)
            assert "@" not in out and "None" not in out, (section.name, lang)


# What `explain --json` gives programs, per topic (README, "explain"): hand-listed.
JSON_KEYS = {
    "gae": ({"rewards", "values", "dones", "gamma", "lam"},
            {"td_errors", "advantages", "returns"}, {"dA0_drewards", "dA0_dvalues"}),
    "whiten": ({"x", "ddof", "eps", "eps_mode", "shift_mean"},
               {"mean", "var", "std", "whitened", "whitened_mean", "whitened_var"}, {"dy0_dx"}),
    "ppo": ({"old_logp", "logp", "advantages", "clip_low", "dual"},
            {"loss", "token_mean", "dual_loss"}, {"grad_logp", "dual_grad_logp"}),
    "grpo": ({"rewards", "group_size", "ddof", "eps", "lengths"},
             {"group_mean", "group_std", "advantages", "group_sums", "loss_at_ratio_one",
              "token_weights"}, {"grad_logp_first_token"}),
    "cispo": ({"ratio", "advantages", "logp", "ppo_clip_low", "cispo_clip_high", "cispo_bound"},
              {"ppo_effective_ratio", "cispo_weight"}, {"ppo_grad_logp", "cispo_grad_logp"}),
    "kl": ({"p", "q"}, {"per_sample", "moments", "far_apart_var", "grad_kl_forward",
                        "grad_kl_reverse"}, {"dk_dlogp", "expected"}),
    "compare": ({"rewards"}, {"minimind_A0", "trl_A0"}, set()),
    "beyond": ({"ratio", "logp", "advantages", "conventions"},
               {"gspo_sequence_ratio_A=+1", "gspo_sequence_ratio_A=-1", "gmpo_sequence_ratio_A=+1",
                "gmpo_sequence_ratio_A=-1"}, {"A=+1", "A=-1"}),
}


def test_the_json_carries_each_topics_documented_fields(topics):
    doc = json.loads(json.dumps(explain.to_json_doc(list(topics.values()))))
    by_name = {t["name"]: t for t in doc["topics"]}
    assert set(by_name) == set(JSON_KEYS)
    for name, (inputs, outputs, gradients) in JSON_KEYS.items():
        t = by_name[name]
        assert (set(t["inputs"]), set(t["outputs"]), set(t["gradients"])) == \
            (inputs, outputs, gradients), name
        assert all(v is not None for part in ("inputs", "outputs") for v in t[part].values())
    for name in ("ppo", "cispo"):
        for tok in by_name[name]["tokens"]:
            assert {"ratio", "grad_logp", "clip_binding"} <= set(tok), name
    assert {"kind", "use", "samples", "is_weight", "expected", "follows"} == \
        set(by_name["kl"]["gradients"]["expected"][0])
    grpo = by_name["grpo"]
    assert grpo["outputs"]["group_sums"] == pytest.approx(
        [sum(grpo["outputs"]["advantages"][:4]), sum(grpo["outputs"]["advantages"][4:])],
        abs=1e-12)
    assert grpo["inputs"]["lengths"] and len(grpo["inputs"]["lengths"]) == 8


def test_beyond_ppo_gradients_follow_each_methods_rule(topics):
    """Hand-derived per-token gradients for ratios [0.5, 0.9, 1.0, 1.3, 2.5], A = ±1, logπ = −1:
    PPO −A·r inside the clip in A's direction and 0 past it; CISPO −A·clip(r, 0.8, 1.2);
    TIS −A·min(r, 2); MIS −A·r up to 2 and 0 beyond; GSPO −A·s/5 with s the geometric mean."""
    g = json.loads(json.dumps(explain.to_json_doc([topics["beyond"]])))["topics"][0]["gradients"]
    r = np.array([0.5, 0.9, 1.0, 1.3, 2.5])
    s = float(np.exp(np.log(r).mean()))
    for A, key in ((1.0, "A=+1"), (-1.0, "A=-1")):
        cut = (r > 1.2) if A > 0 else (r < 0.8)
        np.testing.assert_allclose(g[key]["PPO"], np.where(cut, 0.0, -A * r), atol=1e-12)
        np.testing.assert_allclose(g[key]["CISPO"], -A * np.clip(r, 0.8, 1.2), atol=1e-12)
        np.testing.assert_allclose(g[key]["TIS"], -A * np.minimum(r, 2.0), atol=1e-12)
        np.testing.assert_allclose(g[key]["MIS"], np.where(r > 2.0, 0.0, -A * r), atol=1e-12)
        np.testing.assert_allclose(g[key]["GSPO"], np.full(5, -A * s / 5), atol=1e-12)
    zh = explain.render(topics["beyond"], "zh")
    assert "PPO 之外" in zh and "-0.2158" in zh


def test_the_gae_text_states_the_decay_factors(topics):
    """γλ = 0.99 × 0.95 = 0.9405 weighs δ_(t+l) by 0.9405^l; γ(1 − λ) = 0.99 × 0.05 = 0.0495."""
    en = explain.render(topics["gae"], "en")
    assert "0.9405" in en and "0.0495" in en
    assert "0.8845·(" in en                              # 0.9405² = 0.88454…, l = 2
    assert "1.9000" not in en                            # not γ(1 + λ) = 1.9305 nor γ/λ = 1.0421
    assert "1.0421" not in en and "1.9305" not in en


def test_the_whiten_text_states_mean_var_and_std(topics):
    w = data(topics, "whiten")["outputs"]
    en = explain.render(topics["whiten"], "en")
    for v in (w["mean"], w["var"], w["std"]):
        assert f"{v:.4f}" in en
    assert w["std"] == pytest.approx(math.sqrt(w["var"]), rel=1e-15)


def test_grid_right_aligns_numbers_and_left_aligns_words():
    out = explain.grid(["a", "b"], [["1.5", "x"], ["-2e5", "longer"], ["−0.25", "y"]])
    lines = out.splitlines()
    assert lines[2].startswith("    1.5 | x")           # widths: 5 ("−0.25") and 6
    assert lines[3].startswith("   -2e5 | longer")
    assert lines[4].startswith("  −0.25 | y")
    assert explain.grid(["h"], [["1.2.3"]]).splitlines()[2] == "  1.2.3"   # left: not a number


# ---------------------------------------------------------------- the printed text itself
def _tables(text):
    """Every grid in the text: (headers, rows of cells), split on ' | '."""
    lines, out = text.splitlines(), []
    for k in range(1, len(lines)):
        if re.fullmatch(r"  -+(-\+-+)+", lines[k]):
            head = [c.strip() for c in lines[k - 1].split(" | ")]
            rows = []
            for line in lines[k + 1:]:
                if not line.startswith("  ") or " | " not in line:
                    break
                rows.append([c.strip() for c in line.split(" | ")])
            out.append((head, rows))
    return out


def _num(cell):
    return float(cell.replace("−", "-"))


def test_every_printed_hand_column_equals_the_autograd_column_beside_it(topics):
    pairs = 0
    for topic in topics.values():
        for head, rows in _tables(explain.render(topic, "en")):
            for j, h in enumerate(head[:-1]):
                if h.endswith("hand") and head[j + 1] == "autograd":
                    pairs += 1
                    for row in rows:
                        assert _num(row[j]) == pytest.approx(_num(row[j + 1]), abs=1e-6), \
                            (topic.name, head, row)
    assert pairs >= 4


def test_every_printed_clip_binding_is_where_the_printed_gradient_is_zero(topics):
    tables = [(h, r) for h, r in _tables(explain.render(topics["ppo"], "en")) if "clip binding" in h]
    assert len(tables) == 2
    for head, rows in tables:
        b, g = head.index("clip binding"), next(j for j, h in enumerate(head) if h.endswith("hand"))
        assert [row[b] for row in rows].count("yes") >= 1
        for row in rows:
            assert (row[b] == "yes") == (_num(row[g]) == 0.0), row


def test_the_printed_td_errors_and_unrolled_sums_add_up(topics):
    """Each δ_t line is r + γ·V'·(1 − done) − V = δ and each A_t line Σ (γλ)^l·δ = A, as
    printed (four decimals: within 5e-4)."""
    text = explain.render(topics["gae"], "en")
    deltas = re.findall(r"δ_\d = (-?[\d.]+) \+ ([\d.]+)·(-?[\d.]+)·(\d) − (-?[\d.]+) = (-?[\d.]+)",
                        text)
    assert len(deltas) == 5 and [int(d[3]) for d in deltas] == [1, 1, 1, 1, 0]
    for r, g, v, c, v0, d in deltas:
        assert float(r) + float(g) * float(v) * int(c) - float(v0) == pytest.approx(float(d),
                                                                                   abs=5e-4)
    sums = re.findall(r"A_\d = ((?:[\d.]+·\(-?[\d.]+\)(?: \+ )?)+) = (-?[\d.]+)", text)
    assert len(sums) == 5
    for terms, a in sums:
        pairs = re.findall(r"([\d.]+)·\((-?[\d.]+)\)", terms)
        assert sum(float(w) * float(d) for w, d in pairs) == pytest.approx(float(a), abs=5e-4)


def test_the_dual_clip_table_says_why_each_token_binds_or_not(topics):
    """c = 3, A = −1: r = 0.5 < 1 − ε binds the ordinary clip, r = 4 > c the dual clip."""
    head, rows = [t for t in _tables(explain.render(topics["ppo"], "en"))
                  if "clip binding" in t[0]][1]
    why = [row[head.index("why")] for row in rows]
    assert why[0].startswith("clip binding: A<0 and ratio < 1−ε")
    assert why[3].startswith("dual clip binding: A<0 and ratio > c")
    assert all(w.startswith("not binding") for w in why[1:3])


def test_the_gae_topic_prints_the_seeds_inputs_as_given(topics):
    text = explain.render(topics["gae"], "en")
    assert "  rewards [1.0, 0.0, 0.0, 0.0, 0.5]" in text
    assert "  dones   [0, 0, 0, 0, 1]" in text


def test_the_dual_clip_inputs_in_the_json_give_its_losses(topics):
    """Recomputed by hand from what --json says went in: for A < 0 the dual-clip loss is
    min(max(−A·r, −A·clip(r, 1 − ε, 1 + ε)), −A·c)."""
    ppo = data(topics, "ppo")
    dual, eps = ppo["inputs"]["dual"], ppo["inputs"]["clip_low"]
    want = [min(max(-a * r, -a * min(max(r, 1 - eps), 1 + eps)), -a * dual["clip_c"])
            for r, a in zip(dual["ratio"], dual["advantages"])]
    assert ppo["outputs"]["dual_loss"] == pytest.approx(want, abs=1e-12)
    assert want == pytest.approx([0.8, 1.5, 2.5, 3.0])


def test_the_std_sentence_prints_the_two_advantages_it_compares(topics):
    out = data(topics, "compare")["outputs"]
    for lang in ("en", "zh"):
        numbers = DECIMAL.findall(explain.render(topics["compare"], lang))
        assert f"{out['minimind_A0']:.4f}" in numbers and f"{out['trl_A0']:.4f}" in numbers


def test_plot_into_an_unwritable_folder_refuses_before_printing_anything(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, out, err = run(["explain", "--topic", "gae", "--plot", str(blocker / "figs")])
    assert code == 2 and out == ""
    assert f"--plot {str(blocker / 'figs')!r}: " in err and "is a file, not a folder" in err
    code, out, err = run(["explain", "--topic", "gae", "--plot", str(blocker)])
    assert code == 2 and out == "" and f"--plot {str(blocker)!r}: is a file" in err


def test_plot_of_one_topic_writes_that_topics_figures_only(tmp_path):
    code, _, _ = run(["explain", "--topic", "ppo", "--plot", str(tmp_path)])
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ppo_objective.png"]


def test_the_json_carries_no_untranslated_text_key():
    code, out, _ = run(["explain", "--json"])
    assert code == 0
    assert '"@' not in out and "@why." not in out



def test_the_sapo_sentence_states_where_its_gradient_peaks():
    # SAPO's A = +1 gradient magnitude at τ = 1 is r·4σ(1 − σ), σ = σ(r − 1): find its peak with
    # the reference's own VJP on a fine grid, and compare with what both languages state
    from crosscheck.explain.text import TEXT
    r = np.linspace(1.0, 4.0, 30001)
    lp = np.log(r)[None, :]
    g = -ref_numpy.sapo_loss_vjp(np.ones_like(lp), lp, np.zeros_like(lp),
                                 np.ones_like(lp))["logp"][0]
    peak = int(np.argmax(g))
    at_2_5 = g[int(np.argmin(abs(r - 2.5)))]
    assert f"{r[peak]:.2f}" == "2.06" and f"{g[peak]:.3f}" == "1.575"
    assert f"{at_2_5:.3f}" == "1.491" and at_2_5 < g[peak]
    for lang in ("en", "zh"):
        why = TEXT[lang]["beyond.why"]
        assert "2.06" in why and "1.575" in why and "1.491" in why, lang
        assert "up to r = 2.5" not in why


def test_the_sum_norm_sentence_gives_dr_grpos_divisor():
    # the reference's seq-mean-token-sum-norm divides by T; Dr. GRPO / verl 0.9 by B·T, which
    # is seq-mean-token-sum with norm = T
    from crosscheck.explain.text import TEXT
    m = np.ones((4, 3))
    w_ref = ref_numpy.aggregate_vjp(1.0, np.zeros((4, 3)), m, mode="seq-mean-token-sum-norm")
    w_dr = ref_numpy.aggregate_vjp(1.0, np.zeros((4, 3)), m, mode="seq-mean-token-sum", norm=3)
    np.testing.assert_allclose(w_ref["loss"], 1 / 3)
    np.testing.assert_allclose(w_dr["loss"], 1 / 12)
    for lang in ("en", "zh"):
        assert "1/(B·T)" in TEXT[lang]["grpo.weights_why"], lang
    for lang in ("en", "zh"):
        assert "1/5" in TEXT[lang]["beyond.intro"], lang       # the caption states the scales
