"""The ms-swift and EasyR1 report cards: their pinned code raises no alarm at the rows the
planted bugs target, and each planted one-line bug (a γ, a group of one, unequal groups, a
composition on the training path, a clip or a KL) is caught at its row as a new deviation.
Patches apply to copies made in a temporary directory at test time (never committed).

ms-swift runs where ms-swift 4.6.0 is installed (.ci/run installs it with --no-deps); EasyR1 is
a checkout only (no package index): its tests run where CROSSCHECK_EASYR1 names one."""
import importlib.util
import os
import shutil

import pytest

from crosscheck import trainer as trainers
from crosscheck.trainer import card

CASES = 24
ADV = "swift/rl_core/advantage.py"
HF = "swift/rlhf_trainers/grpo_trainer.py"
MG = "swift/megatron/trainers/grpo_trainer.py"
CORE = "verl/trainer/core_algos.py"
ACTOR = "verl/workers/actor/dp_actor.py"
HF_LOSS = "GRPOTrainer._compute_loss_and_metrics"

# (trainer, file, text, replacement, which occurrence, the row that must catch it)
PATCHES = [
    # ms-swift 4.6.0
    ("ms-swift", HF, "torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)",
     "torch.clamp(coef_1, 1 - self.epsilon_high, 1 + self.epsilon_low)", 0,
     f"{HF_LOSS} [dapo, ε 0.2/0.28]"),
    ("ms-swift", HF, "decay_block = torch.pow(gamma, distance.clamp(min=0))",   # FIPO's γ
     "decay_block = torch.pow(gamma, distance.clamp(min=0) + 1)", 0,
     "GRPOTrainer._compute_fipo_influence [decay 2, clip ±0.2, delta 10]"),
    ("ms-swift", ADV, "request_advantages[idx_t] = r_group - r_group.mean()",  # a group of one
     "request_advantages[idx_t] = r_group", 0, "compute_advantages_dynamic [rloo]"),
    ("ms-swift", ADV, "            K = len(idxs)\n",                        # unequal groups
     "            K = len(unique_rewards) // len(prompt_to_indices)\n", 0,
     "compute_advantages_dynamic [rloo]"),
    ("ms-swift", HF, "            loss = loss * gradient_accumulation_steps",   # the trainer's path
     "            loss = loss", 0, "GRPOTrainer.compute_loss [dapo, the trainer's path]"),
    ("ms-swift", HF, "                per_token_loss = per_token_loss * fipo_weight",
     "                per_token_loss = per_token_loss", 0, f"{HF_LOSS} [fipo]"),  # composition
    ("ms-swift", MG, "(micro_batch_size * self.max_completion_length)",
     "(micro_batch_size + self.max_completion_length)", 0,
     "MegatronGRPOTrainer.loss_func [dr_grpo]"),
    ("ms-swift", ADV, "std = grouped.std(dim=1).repeat_interleave(K) if K > 1",
     "std = grouped.std(dim=1, correction=0).repeat_interleave(K) if K > 1", 0,
     "compute_advantages [grpo, group]"),
    # EasyR1 (a checkout)
    ("easyr1", CORE, "running_return = token_level_rewards[:, t] + gamma * running_return",
     "running_return = token_level_rewards[:, t] + running_return", 0,
     "compute_reinforce_plus_plus_outcome_advantage [γ 0.99]"),          # a dropped γ
    ("easyr1", CORE, "baseline = (id2sum[index[i]] - scores[i]) / (sample_num - 1)",
     "baseline = (id2sum[index[i]] - scores[i]) / sample_num", 0,
     "compute_rloo_outcome_advantage"),
    ("easyr1", CORE, "id2std[idx] = torch.std(torch.tensor(id2score[idx]))",
     "id2std[idx] = torch.std(torch.tensor(id2score[idx]), correction=0)", 0,
     "compute_grpo_outcome_advantage"),
    ("easyr1", ACTOR, "loss = loss * torch.sum(response_mask) * self.world_size / total_response_tokens",
     "loss = loss * self.world_size", 0,
     "DataParallelPPOActor.update_policy [the actor's averaging, token]"),  # composition
    ("easyr1", CORE, "clipped_pg_loss_lower = torch.min(clipped_pg_loss_higher, pg_loss3)",
     "clipped_pg_loss_lower = torch.max(clipped_pg_loss_higher, pg_loss3)", 0,
     "compute_policy_loss [ppo, token]"),
    ("easyr1", CORE, "kld = (kl.exp() - kl - 1).contiguous()", "kld = (kl.exp() + kl - 1).contiguous()",
     0, "compute_kl [low_var_kl]"),
    ("easyr1", CORE, "vf_loss = 0.5 * average_loss(", "vf_loss = average_loss(", 0,
     "compute_value_loss"),
]
NAMES = ("ms-swift", "easyr1")


def _ascii_id(patch):
    raw = f"{patch[0]}:{patch[5]}:{patch[2][:30]}"
    return raw.replace("γ", "gamma").replace("ε", "eps").replace("±", "pm").encode(
        "ascii", "replace").decode()


def _root(name):
    """The directory holding the trainer's package, or a reason to skip."""
    if name == "easyr1":
        path = os.environ.get("CROSSCHECK_EASYR1")
        if not path:
            return None, "CROSSCHECK_EASYR1 does not name an EasyR1 checkout (GitHub only)"
        return path, ""
    from importlib import metadata
    t = trainers.get(name)
    if importlib.util.find_spec(t.package) is None or metadata.version(t.dist) != t.pinned:
        return None, f"{name} is not installed at its pinned version (.ci/run installs it)"
    return os.path.dirname(os.path.dirname(importlib.util.find_spec(t.package).origin)), ""


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """A copy of each trainer's package (EasyR1: its verl/), made once for the module."""
    out = {}
    for name in NAMES:
        root, _ = _root(name)
        if root is None:
            continue
        package = trainers.get(name).package
        dest = tmp_path_factory.mktemp(name.replace("-", ""))
        shutil.copytree(os.path.join(root, package), dest / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
        out[name] = dest
    return out


def _patched(text, old, new, nth):
    at = -1
    for _ in range(nth + 1):
        at = text.find(old, at + 1)
        assert at >= 0, f"the pinned code no longer holds {old!r} (occurrence {nth})"
    return text[:at] + new + text[at + len(old):]


def test_each_new_card_has_at_least_five_planted_bugs():
    for name in NAMES:
        assert sum(p[0] == name for p in PATCHES) >= 5, name


@pytest.mark.parametrize("name", NAMES)
def test_the_unpatched_copy_raises_no_alarm_at_any_patched_row(name, copies):
    if name not in copies:
        pytest.skip(_root(name)[1])
    rows = sorted({row for t, *_, row in PATCHES if t == name})
    c = card.run(trainers.get(name), path=str(copies[name]), cases=CASES, only=rows)
    assert set(rows) <= {r.row.name for r in c.rows}
    for r in c.rows:
        if r.row.name in rows:
            assert r.verdict in ("CONFORMS", "KNOWN DEVIATION"), (r.row.name, r.verdict,
                                                                  r.reason, r.findings)


@pytest.mark.parametrize("name, rel, old, new, nth, row", PATCHES,
                         ids=[_ascii_id(p) for p in PATCHES])
def test_a_planted_bug_is_caught_at_its_row_as_a_new_deviation(name, rel, old, new, nth, row,
                                                                copies):
    if name not in copies:
        pytest.skip(_root(name)[1])
    path = copies[name] / rel
    original = path.read_text(encoding="utf-8")
    path.write_text(_patched(original, old, new, nth), encoding="utf-8")
    try:
        c = card.run(trainers.get(name), path=str(copies[name]), cases=CASES, only=[row])
    finally:
        path.write_text(original, encoding="utf-8")
    (r,) = [r for r in c.rows if r.row.name == row]
    new_ones = [f for f in r.findings if f["grade"] == "deviation" and not f["known"]]
    assert r.verdict == "DOES NOT CONFORM" and new_ones, (r.verdict, r.reason, r.findings)
    assert c.exit_code == 1


def test_ms_swift_4_5_3s_unscaled_window_loss_shows_on_the_trainers_path_row(copies):
    """4.5.3 divides dapo's window-normalised loss by the accumulation steps (#10117); 4.6.0
    multiplies it back (_undo_gradient_accumulation_scaling). The planted revert above is that
    release's code: the trainer-path row sees the loss halved at 2 accumulation steps."""
    if "ms-swift" not in copies:
        pytest.skip(_root("ms-swift")[1])
    path = copies["ms-swift"] / HF
    original = path.read_text(encoding="utf-8")
    path.write_text(_patched(original, "            loss = loss * gradient_accumulation_steps",
                             "            loss = loss", 0), encoding="utf-8")
    try:
        c = card.run(trainers.get("ms-swift"), path=str(copies["ms-swift"]), cases=CASES,
                     only=["GRPOTrainer.compute_loss"])
    finally:
        path.write_text(original, encoding="utf-8")
    (r,) = c.rows
    value = [f for f in r.findings if f["check"] == "value"]
    assert value and "×0.5" in value[0]["signature"], r.findings
