"""Planted bugs in the checkout-only trainers' own code: one-line text patches, applied to a copy
of a checkout made in a temporary directory at test time (never committed). Each is caught at
its row by a new, unexplained deviation, and the unpatched copy raises no alarm at those rows.

A checkout is named by an environment variable (these trainers are not on the package index,
so CI cannot install them); without it the tests are skipped, saying which variable to set."""
import os
import shutil

import pytest

from crosscheck import trainer as trainers
from crosscheck.trainer import card

CASES = 24
# trainer -> (the environment variable naming its checkout, the commit the patches were read at)
CHECKOUTS = {"open-instruct": ("CROSSCHECK_OPEN_INSTRUCT", "e6c3044aa")}

GU = "open_instruct/grpo_utils.py"
MU = "open_instruct/model_utils.py"
RL = "open_instruct/rl_utils.py"
FAST = "open_instruct/grpo_fast.py"
DATA = "open_instruct/data_loader.py"
STEP = "PolicyTrainerRayProcess.step [dapo 0.2/0.272, k3 KL 0.05 (the defaults)]"

# (trainer, file, text, replacement, which occurrence, the row that must catch it)
PATCHES = [
    # open-instruct at e6c3044aa
    ("open-instruct", GU, "1.0 - config.clip_lower, 1.0 + config.clip_higher",
     "1.0 - config.clip_higher, 1.0 + config.clip_lower", 0, STEP),
    ("open-instruct", GU, "pg_loss = torch.max(pg_losses, pg_losses2)",
     "pg_loss = torch.min(pg_losses, pg_losses2)", 0, STEP),
    ("open-instruct", GU, "torch.clamp(ratio.detach(), max=1.0 + config.clip_higher)",
     "torch.clamp(ratio, max=1.0 + config.clip_higher)", 0,
     "PolicyTrainerRayProcess.step [cispo]"),
    ("open-instruct", GU, "pg_loss *= rho_weights", "pg_loss *= rho_weights.clamp(max=1.0)", 0,
     "compute_grpo_loss [dapo × ρ weights (the defaults)]"),
    ("open-instruct", FAST, "per_token_loss_BT = pg_loss_BT + self.args.beta * kl_BT",
     "per_token_loss_BT = pg_loss_BT - self.args.beta * kl_BT", 0, STEP),
    ("open-instruct", MU, "torch.expm1(-ref_logprobs_diff) + ref_logprobs_diff",
     "torch.expm1(ref_logprobs_diff) - ref_logprobs_diff", 0, "estimate_kl [2 (k3)]"),
    ("open-instruct", MU, "ratio * ref_logprobs_diff,", "ratio.detach() * ref_logprobs_diff,", 0,
     "estimate_kl [3 (ratio·k1)]"),
    ("open-instruct", GU, "torch.sign(logprob_diff) * advantages > 0",
     "torch.sign(logprob_diff) * advantages < 0", 0,
     "compute_rho_correction [TV filter 0.3/1.5, one response per row]"),
    ("open-instruct", GU,
     "rho_clamped = torch.clamp(rho_clamped, max=config.rho_clamp_upper_bound)",
     "rho_clamped = torch.clamp(rho_clamped, min=config.rho_clamp_upper_bound)", 0,
     "compute_rho_correction [truncation at 2 (the default)]"),
    ("open-instruct", GU, "dropped_low = (rho < lower) & response_mask",
     "dropped_low = (rho > lower) & response_mask", 0,
     "compute_rho_correction [token mask 0.5/5]"),
    ("open-instruct", GU, "seq_count = valid.sum(dim=-1, keepdim=True).clamp_min(1.0)",
     "seq_count = torch.full_like(seq_sum, values.shape[-1])", 0,
     "compute_rho_correction [sequence mask 0.5/2, one response per row]"),
    ("open-instruct", RL, "denom = mask.sum(dim=axis) if denominator is None else denominator",
     "denom = mask.numel() if denominator is None else denominator", 0,
     "masked_mean [token mean]"),
    ("open-instruct", DATA, "std_grouped_rewards = scores_per_prompt.std(axis=-1)",
     "std_grouped_rewards = scores_per_prompt.std(axis=-1, ddof=1)", 0,
     "DataPreparationActor._data_preparation_loop [standard]"),
]
NAMES = sorted({p[0] for p in PATCHES})


def _ascii_id(patch):
    raw = f"{patch[0]}:{patch[5]}:{patch[2][:30]}"
    return raw.replace("·", ".").replace("×", "x").replace("ρ", "rho").encode(
        "ascii", "replace").decode()


def _checkout(name):
    """The checkout named by the trainer's environment variable, or a skip naming it."""
    var, commit = CHECKOUTS[name]
    path = os.environ.get(var, "")
    if not path:
        pytest.skip(f"set {var} to a checkout of {name} at commit {commit} to run its planted "
                    f"bugs")
    if not os.path.isdir(os.path.join(path, trainers.get(name).package)):
        pytest.fail(f"{var} is {path!r}, which holds no {trainers.get(name).package}/ folder")
    return path


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """For each trainer whose checkout is named, a copy of its package, made once; the others
    map to None (their tests skip)."""
    out = {}
    for name in NAMES:
        var, _ = CHECKOUTS[name]
        if not os.environ.get(var):
            out[name] = None
            continue
        package = trainers.get(name).package
        root = tmp_path_factory.mktemp(name)
        shutil.copytree(os.path.join(os.environ[var], package), root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
        out[name] = root
    return out


def _patched(text, old, new, nth):
    at = -1
    for _ in range(nth + 1):
        at = text.find(old, at + 1)
        assert at >= 0, f"the pinned code no longer holds {old!r} (occurrence {nth})"
    return text[:at] + new + text[at + len(old):]


def test_every_checkout_trainer_has_at_least_five_planted_bugs_each_on_a_row_of_its_card():
    for name in CHECKOUTS:
        rows = {r.name for r in trainers.get(name).rows}
        patches = [p for p in PATCHES if p[0] == name]
        assert len(patches) >= 5, name
        assert {p[5] for p in patches} <= rows, {p[5] for p in patches} - rows


@pytest.mark.parametrize("name", NAMES)
def test_the_unpatched_copy_raises_no_alarm_at_any_patched_row(name, copies):
    _checkout(name)
    rows = sorted({row for t, *_, row in PATCHES if t == name})
    c = card.run(trainers.get(name), path=str(copies[name]), cases=CASES, only=rows)
    assert set(rows) <= {r.row.name for r in c.rows}
    for r in c.rows:
        assert r.verdict in ("CONFORMS", "KNOWN DEVIATION"), (r.row.name, r.verdict, r.reason)
    assert c.exit_code == 0


@pytest.mark.parametrize("name, rel, old, new, nth, row", PATCHES,
                         ids=[_ascii_id(p) for p in PATCHES])
def test_a_planted_bug_is_caught_at_its_row_as_a_new_deviation(name, rel, old, new, nth, row,
                                                                copies):
    _checkout(name)
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
    assert all(f["kind"] == "new" for f in new_ones)
    assert c.exit_code == 1
