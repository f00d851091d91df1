"""No verdict without a check: an audit that checked nothing is INCONCLUSIVE (never CONFORMS),
a request the audit cannot honour is a usage error before the first case, and a partial run
says what it covered."""
import math

import pytest
import torch

from crosscheck import assert_conforms, audit
from crosscheck.audit import AuditUsageError
from tests.audit.corpus import N, finding, gae_loop, global_token_mean, kl, ppo, whiten
from tests.helpers import run_cli

CORRECT_PPO = ppo()


def verl_names(log_prob, old_log_prob, advantages, response_mask):
    """A correct PPO loss under verl's parameter names."""
    return CORRECT_PPO(log_prob, old_log_prob, advantages, response_mask)


# ================================================================ adapters that take nothing
def test_parameter_names_the_reference_does_not_pass_give_inconclusive_with_the_mapping():
    report = audit(verl_names, "ppo_clip_loss", cases=6)
    assert report.verdict == "INCONCLUSIVE" and not report.ok and report.n_cases == 0
    line = report.verdict_line()
    assert line.startswith("verdict: INCONCLUSIVE: the value check ran on no case")
    assert "the reference passes: logp, old_logp, advantages, mask" in line
    assert "your function takes: log_prob, old_log_prob, advantages, response_mask" in line
    assert "--map log_prob=logp --map old_log_prob=old_logp --map response_mask=mask (CLI)" in line
    assert ("rename={'log_prob': 'logp', 'old_log_prob': 'old_logp', 'response_mask': 'mask'} "
            "(API)") in line


def test_the_mapping_it_proposes_makes_the_same_function_conform():
    report = audit(verl_names, "ppo_clip_loss", cases=N, rename={
        "log_prob": "logp", "old_log_prob": "old_logp", "response_mask": "mask"})
    assert report.ok and report.n_cases == N, str(report)


def test_a_function_of_star_args_only_is_inconclusive_and_told_to_name_its_parameters():
    report = audit(lambda *args: args[0], "ppo_clip_loss", cases=6)
    assert report.verdict == "INCONCLUSIVE"
    assert "your function takes *args only: the reference passes its inputs by keyword" in \
        report.verdict_line()


def test_a_function_of_keyword_arguments_only_is_given_every_input_and_judged():
    def kwargs_only(**kw):
        return CORRECT_PPO(kw["logp"], kw["old_logp"], kw["advantages"], kw["mask"])
    assert audit(kwargs_only, "ppo_clip_loss", cases=N).ok
    wrong = audit(lambda **kw: kw["logp"] * 0, "ppo_clip_loss", cases=6)
    assert wrong.verdict == "DOES NOT CONFORM" and "value" in {f.check for f in wrong.failures}


@pytest.mark.parametrize("rename, message", [
    ({"log_prob": "logprob"}, "rename maps 'log_prob' to 'logprob', which ppo_clip_loss does "
                              "not pass; it passes logp, old_logp, advantages, mask"),
    ({"logits": "logp"}, "rename names 'logits', which your function does not take; it takes "
                         "log_prob, old_log_prob, advantages, response_mask"),
    (["log_prob"], "rename is ['log_prob']; expected a dict"),
])
def test_a_rename_that_cannot_apply_is_a_usage_error(rename, message):
    with pytest.raises(AuditUsageError, match="^" + message.replace("[", r"\[").replace(
            "(", r"\(").replace(")", r"\)")):
        audit(verl_names, "ppo_clip_loss", cases=2, rename=rename)


def test_assert_conforms_fails_on_inconclusive_with_the_verdict_as_its_first_line():
    with pytest.raises(AssertionError) as exc:
        assert_conforms(verl_names, "ppo_clip_loss", cases=4)
    first = str(exc.value).splitlines()[0]
    assert first.startswith("verdict: INCONCLUSIVE: the value check ran on no case")
    with pytest.raises(AssertionError) as exc:
        assert_conforms(kl("k1"), "kl_penalty", kind="k3", cases=4)
    assert str(exc.value).splitlines()[0].startswith("verdict: DOES NOT CONFORM (")


def test_a_loss_audited_without_gradients_is_inconclusive():
    """A loss is what trainers differentiate: the numpy backend cannot check it."""
    import numpy as np

    def numpy_kl(logp, ref_logp, mask):
        x = np.where(mask, ref_logp - logp, 0.0)
        return np.where(mask, np.exp(x) - x - 1, 0.0)
    report = audit(numpy_kl, "kl_penalty", backend="numpy", cases=N)
    assert report.verdict == "INCONCLUSIVE" and finding(report, "value").status == "pass"
    assert "kl_penalty is a loss trainers differentiate, and the numpy backend has no " \
           "gradients: audit it with backend='torch'" in report.inconclusive


# ================================================================ arguments
@pytest.mark.parametrize("cases", [0, -5, 2.5, True, "10", None])
def test_cases_must_be_an_integer_of_at_least_one(cases):
    with pytest.raises(AuditUsageError, match=rf"^cases is {cases!r}; expected an integer ≥ 1$"
                       .replace("(", r"\(").replace(")", r"\)")):
        audit(kl("k3"), "kl_penalty", cases=cases)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", False])
def test_seed_must_be_a_non_negative_integer(seed):
    with pytest.raises(AuditUsageError, match=rf"^seed is {seed!r}; expected an integer ≥ 0$"):
        audit(kl("k3"), "kl_penalty", cases=2, seed=seed)


@pytest.mark.parametrize("name", ["rtol", "atol"])
@pytest.mark.parametrize("value", [-1e-6, math.nan, math.inf, "1e-6", True])
def test_tolerances_must_be_finite_and_non_negative(name, value):
    with pytest.raises(AuditUsageError, match=rf"^{name} is .*; expected a finite number ≥ 0$"):
        audit(kl("k3"), "kl_penalty", cases=2, **{name: value})


@pytest.mark.parametrize("kwargs, message", [
    (dict(precision="float16"), "precision is 'float16'; expected one of 'float64', 'float32'"),
    (dict(kl_use="penalty"), "kl_use is 'penalty'; expected one of 'loss', 'reward'"),
    (dict(accumulation="avg"), "accumulation is 'avg'; expected one of 'mean', 'sum'"),
    (dict(backend="jax"), "backend is 'jax'; expected 'torch' or 'numpy'"),
])
def test_options_outside_their_choices_are_usage_errors(kwargs, message):
    with pytest.raises(AuditUsageError, match="^" + message):
        audit(kl("k3"), "kl_penalty", cases=2, **kwargs)


# ================================================================ conventions the reference refuses
@pytest.mark.parametrize("fn, ref, conventions, key", [
    (whiten(0, 1e-8, "var"), "whiten", dict(ddof="abc"), "ddof is 'abc'"),
    (whiten(0, 1e-8, "var"), "whiten", dict(ddof=5), "ddof is 5"),
    (whiten(0, 1e-8, "var"), "whiten", dict(eps=-1), "eps is -1"),
    (CORRECT_PPO, "ppo_clip_loss", dict(clip_low=-1), "clip_low is -1"),
    (CORRECT_PPO, "ppo_clip_loss", dict(clip_low=1.5), "clip_low is 1.5"),
    (gae_loop(1.0, 1.0), "gae", dict(gamma=1.5, lam=1.0), "gamma is 1.5"),
])
def test_a_convention_the_reference_refuses_is_a_usage_error_naming_the_key(fn, ref,
                                                                           conventions, key):
    calls = []

    def spy(**kw):
        calls.append(1)
        return fn(**kw)
    with pytest.raises(AuditUsageError, match=f"^the reference {ref} refuses these conventions "
                                              rf"\(.*\): {key}"):
        audit(spy, ref, cases=5, **conventions)
    assert calls == []                         # refused before the first case


@pytest.mark.parametrize("argv, message", [
    (["--set", "ddof=abc"], "ddof is 'abc'"),
    (["--set", "ddof=5"], "ddof is 5"),
    (["--set", "eps=-1"], "eps is -1"),
])
def test_the_command_line_reports_a_refused_convention_with_exit_2(tmp_path, argv, message):
    target = tmp_path / "mine.py"
    target.write_text("def w(x, mask):\n    return x\n")
    code, out, err = run_cli(["audit", f"{target}:w", "--ref", "whiten", "--cases", "3"] + argv)
    assert code == 2 and message in err and out == ""


# ================================================================ profiles: the keys of the loss
def cispo_absolute(logp, old_logp, advantages, mask, ref_logp=None):
    """TRL's CISPO objective with its dapo normalisation (no KL): a correct one."""
    A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    w = torch.exp(torch.where(m, logp - old_logp, zero)).clamp(max=5.0).detach()
    per_token = torch.where(m, -w * torch.where(m, A, zero) * torch.where(m, logp, zero), zero)
    return per_token.sum() / m.sum().clamp(min=1)


def test_a_profile_gives_cispo_only_cispos_keys():
    """TRL's CISPO objective: no clip_low (which CISPO's absolute bound refuses), no clip_c."""
    report = audit(cispo_absolute, "policy_objective", profile="trl", loss="cispo",
                   accumulation="mean", cases=N)
    assert "clip_low" not in report.conventions and "clip_c" not in report.conventions
    assert report.conventions["bound"] == "absolute" and report.conventions["clip_high"] == 5.0
    assert report.n_cases == N and finding(report, "value").status == "pass", str(report)


@pytest.mark.parametrize("profile, loss", [("verl", "cispo"), ("verl", "gspo"),
                                           ("openrlhf", "gspo")])
def test_the_verl_and_openrlhf_profiles_run_their_other_losses_without_ppos_keys(profile, loss):
    report = audit(lambda **kw: kw["logp"].sum() * 0, "policy_objective", profile=profile,
                   loss=loss, cases=4)
    assert "clip_c" not in report.conventions and report.conventions["loss"] == loss
    assert report.n_cases == 4 and report.verdict == "DOES NOT CONFORM"


def test_a_loss_the_profile_does_not_have_is_a_usage_error():
    with pytest.raises(AuditUsageError, match="profile 'openrlhf' has no policy_objective with "
                                              "loss 'cispo'; it has: ppo, gspo"):
        audit(cispo_absolute, "policy_objective", profile="openrlhf", loss="cispo", cases=2)


def test_without_a_kl_term_the_objective_need_not_take_ref_logp():
    """beta = 0: ref_logp cannot change the objective, so a function without it runs every
    case; with beta > 0 it must take it."""
    report = audit(cispo_absolute, "policy_objective", profile="trl", loss="cispo",
                   accumulation="mean", cases=6)
    assert report.skipped == {}

    def no_ref(logp, old_logp, advantages, mask):
        return cispo_absolute(logp, old_logp, advantages, mask)
    assert audit(no_ref, "policy_objective", profile="trl", loss="cispo", accumulation="mean",
                 cases=6).skipped == {}
    report = audit(no_ref, "policy_objective", profile="trl", loss="cispo", beta=0.04,
                   accumulation="mean", cases=6)
    assert report.verdict == "INCONCLUSIVE"
    assert report.skipped == {"your function does not accept ref_logp=": 6}


# ================================================================ partial coverage
def test_a_partial_skip_is_a_coverage_line_naming_what_the_skipped_cases_need():
    def no_dones(rewards, values, mask):
        return gae_loop(0.99, 0.95)(rewards, values, mask)
    report = audit(no_dones, "gae", gamma=0.99, lam=0.95, cases=N)
    assert report.ok and 0 < report.n_cases < N
    text = str(report)
    assert f"  coverage: ran {report.n_cases} of {N} cases\n" in text
    for why, n in report.skipped.items():
        assert why in ("your function does not accept dones=",
                       "your function does not accept last_value=")
        assert f"  note: {n} cases skipped: {why}\n" in text
    assert sum(report.skipped.values()) == N - report.n_cases


def test_inputs_named_by_the_function_only_are_passed_and_a_required_one_is_given():
    """n_tokens_global reaches a function that names it (required or not), and nothing else."""
    seen = []

    def required(loss, mask, n_tokens_global):
        seen.append(n_tokens_global)
        return global_token_mean(loss, mask, n_tokens_global)
    report = audit(required, "aggregate", mode="token-mean", cases=N)
    assert report.ok and report.skipped == {}, str(report)
    assert seen and all(isinstance(n, int) for n in seen)
    assert "global counts: your function receives n_tokens_global" in str(report)

    def plain(loss, mask, **kw):
        assert "n_tokens_global" not in kw and "n_sequences_global" not in kw
        return global_token_mean(loss, mask)
    assert audit(plain, "aggregate", mode="token-mean", accumulation="sum", cases=6).n_cases == 6


def test_a_required_parameter_the_reference_never_passes_is_named_not_a_type_error():
    def needs_config(loss, mask, config):
        return global_token_mean(loss, mask)
    report = audit(needs_config, "aggregate", mode="token-mean", cases=4)
    assert report.verdict == "INCONCLUSIVE"
    assert report.skipped == {"your function requires config=, which the reference does not "
                              "pass": 4}


# ================================================================ what user code raises
@pytest.mark.parametrize("exc, text", [(SystemExit(3), "SystemExit: 3"),
                                       (KeyboardInterrupt(), "KeyboardInterrupt"),
                                       (GeneratorExit(), "GeneratorExit")])
def test_a_function_raising_a_base_exception_fails_raises_and_the_audit_goes_on(exc, text):
    def raising(logp, ref_logp, mask):
        raise exc
    report = audit(raising, "kl_penalty", kind="k3", cases=4)
    f = finding(report, "raises")
    assert f.status == "fail" and f.cases == 4
    assert f.message.startswith(f"{text} at ") and "in raising" in f.message
    assert report.verdict == "DOES NOT CONFORM"


# ================================================================ every registry function
def _moments(kind):
    def fn(logits, ref_logits):
        lp, lr = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
        p, q = lp.exp(), lr.exp()
        u = lr - lp
        k = {"k1": -u, "k2": 0.5 * u ** 2, "k3": torch.exp(u) - 1 - u}[kind]
        mean, kl_f = (p * k).sum(), (p * (lp - lr)).sum()
        return dict(kl_forward=kl_f, kl_reverse=(q * (lr - lp)).sum(), mean=mean,
                    bias=mean - kl_f, var=(p * (k - mean) ** 2).sum())
    return fn


def _expected_gradient(kind):
    """On-policy E_π[∇k] as a loss: π ⊙ k' − π Σ π k', with k' = dk/dℓ."""
    @torch.no_grad()
    def fn(logits, ref_logits):
        lp, lr = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
        p, q = lp.exp(), lr.exp()
        u = lr - lp
        dk = {"k1": torch.ones_like(u), "k2": -u, "k3": 1 - torch.exp(u)}[kind]
        kl_f = (p * (lp - lr)).sum()
        return dict(expected=p * dk - p * (p * dk).sum(), grad_kl_forward=p * (lp - lr - kl_f),
                    grad_kl_reverse=p - q)
    return fn


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimator_moments_and_gradients_are_audited(kind):
    report = audit(_moments(kind), "kl_estimator_moments", kind=kind, cases=N)
    assert report.ok, str(report)
    assert finding(report, "grad").status == "pass"        # torch twin differentiates through
    report = audit(_expected_gradient(kind), "kl_estimator_gradient", kind=kind, cases=N)
    assert report.ok and report.n_cases > 0, str(report)
    assert report.skipped == {"your function does not accept sample_logits=":
                              N - report.n_cases}


def test_a_wrong_moment_is_named_by_its_key():
    def biased_var(logits, ref_logits):
        out = _moments("k3")(logits, ref_logits)
        out["var"] = out["var"] + out["mean"] ** 2            # E[k²], not the variance
        return out
    report = audit(biased_var, "kl_estimator_moments", kind="k3", cases=N)
    assert finding(report, "value").status == "fail"
    assert finding(report, "value").message.startswith("var: yours ")


def test_a_registry_function_needing_a_convention_is_refused_by_name():
    with pytest.raises(AuditUsageError, match="^kl_estimator_moments needs kind: pass e.g. "
                                              r"kind=\.\.\. \(or --set kind=\.\.\.\) or a "
                                              "profile$"):
        audit(_moments("k3"), "kl_estimator_moments", cases=2)


def _k3(logp, ref_logp, mask):
    u = ref_logp - logp
    return torch.exp(u) - 1 - u


def _mutating(logp, ref_logp, mask):
    ref_logp.add_(0.1)
    return _k3(logp, ref_logp, mask)


@pytest.mark.parametrize("fn, says", [
    (lambda logp, ref_logp, mask: -_k3(logp, ref_logp, mask),
     "its values are the reference's negated, a flipped sign"),
    (lambda logp, ref_logp, mask: _k3(logp, ref_logp, mask).tolist(), "returned a list"),
    (lambda logp, ref_logp, mask: float(_k3(logp, ref_logp, mask).sum()), "returned a float"),
    (lambda logp, ref_logp, mask: _k3(logp, ref_logp, mask).T,
     "returned a tensor of shape (6, 1) for logp of shape (1, 6)"),
    (_mutating, "changed its input ref_logp in place"),
])
def test_the_kl_direction_check_names_what_it_saw(fn, says):
    report = audit(fn, "kl_penalty", kind="k3", cases=6)
    f = next(f for f in report.findings if f.check == "kl_direction")
    assert f.status == "fail" and says in f.message, f.message
    assert "AttributeError" not in f.message and "TypeError" not in f.message
    assert "is its sign flipped" not in f.message


def _ppo_in_float32(logp, old_logp, advantages, mask):
    """PPO computed in float32 and cast back to float64, as mixed-precision code does."""
    a = advantages if advantages.dim() == 2 else advantages[:, None]
    r = torch.exp(logp.float() - old_logp.float())
    a = a.float()
    return (-torch.min(r * a, torch.clamp(r, 0.8, 1.2) * a)).double()


def test_float32_code_cast_back_gets_the_hint_and_conforms_at_float32():
    report = audit(_ppo_in_float32, "ppo_clip_loss", cases=60)
    assert not report.ok
    for f in report.failures:               # rounding, or overflow beyond float32's range
        assert "pass precision='float32'" in f.message, (f.check, f.message)
    at32 = audit(_ppo_in_float32, "ppo_clip_loss", cases=60, precision="float32")
    assert at32.ok, str(at32)
    assert all(f.grade == "robustness" for f in at32.findings if f.status == "warn")
    assert "carries no gradient" not in str(at32)


_ENDING = ("import ctypes, os, sys\n"
           "def k3(logp, ref_logp, mask):\n"
           "    {how}\n")


@pytest.mark.parametrize("how, text", [("os._exit(0)", "os._exit(0)"),
                                       ("sys.exit(0)", "SystemExit: 0")])
def test_a_function_that_ends_the_process_fails_raises_and_never_conforms(how, text, tmp_path):
    # in a child Python: an audit ended with its process would leave exit status 0, no verdict
    import subprocess
    import sys
    from tests.helpers import ROOT
    target = tmp_path / "ending.py"
    target.write_text(_ENDING.format(how=how))
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('ending', {str(target)!r})\n"
            "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
            "from crosscheck import audit\n"
            "report = audit(mod.k3, 'kl_penalty', kind='k3', cases=3)\n"
            "print(report)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "verdict: DOES NOT CONFORM (" in proc.stdout, proc.stdout
    assert f"FAIL raises" in proc.stdout and text in proc.stdout


def test_no_map_is_suggested_for_a_function_that_no_map_makes_fit():
    def gae_like(rewards, values, dones):         # not a KL term: no renaming fits it
        return rewards
    report = audit(gae_like, "kl_penalty", kind="k3", cases=2)
    line = report.verdict_line()
    assert report.verdict == "INCONCLUSIVE" and "map them" not in line and "rename=" not in line
    assert ("no --map makes it fit: your function requires rewards=, values=, dones=, and "
            "kl_penalty passes no input to match values=, dones=") in line


def test_a_map_is_suggested_where_it_makes_the_call_fit():
    def k3(log_prob, ref_log_prob, response_mask):
        return log_prob
    line = audit(k3, "kl_penalty", kind="k3", cases=2).verdict_line()
    assert ("map them: --map log_prob=logp --map ref_log_prob=ref_logp --map "
            "response_mask=mask") in line


@pytest.mark.parametrize("value, seen", [(3, "an int (3)"), ("0.5", "a str ('0.5')")])
def test_a_loss_returning_a_python_value_is_a_shape_failure_naming_it(value, seen):
    def agg(loss, mask):
        return value
    report = audit(agg, "aggregate", mode="token-mean", cases=3)
    text = str(report)
    assert "AttributeError" not in text and "object has no attribute" not in text
    f = finding(report, "shape")
    assert f.status == "fail" and f.message == (
        f"your function returned {seen}, not a torch tensor (backend='torch': a loss trainers "
        f"differentiate must carry its gradient); expected ()")
    assert report.verdict.startswith("DOES NOT CONFORM")
