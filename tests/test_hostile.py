"""Hostile inputs through every public entry: each row is what a user might pass and what they
must get back (a clear error naming the problem, or the documented exit code), never a traceback
for a user error. README "Hostile inputs" summarises this table."""
import time

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from tests.helpers import EXAMPLES, run_cli
from crosscheck import audit
from crosscheck.audit import AuditUsageError
from crosscheck.bridge import tensor as to_torch

LP = np.full((2, 3), -1.0)
EX = EXAMPLES

# (entry, what is passed, call, expected exception, message fragment)
API = [
    ("ref_numpy.ppo_clip_loss", "strings", lambda: ref_numpy.ppo_clip_loss(
        np.array([["a"]]), np.array([["b"]]), np.array([["c"]])), TypeError, "floating-point"),
    ("ref_numpy.kl_penalty", "None for an array", lambda: ref_numpy.kl_penalty(None, LP),
     TypeError, "logp has dtype object"),
    ("ref_numpy.kl_penalty", "a 0-d scalar", lambda: ref_numpy.kl_penalty(np.float64(1.0), LP),
     ValueError, "expected [B, T]"),
    ("ref_numpy.kl_penalty", "complex numbers", lambda: ref_numpy.kl_penalty(LP + 0j, LP),
     TypeError, "complex"),
    ("ref_numpy.kl_penalty", "inf at a valid position",
     lambda: ref_numpy.kl_penalty(np.where(np.eye(2, 3) > 0, np.inf, LP), LP), ValueError,
     "valid position (0, 0)"),
    ("ref_numpy.gae", "gamma=True", lambda: ref_numpy.gae(LP, LP, gamma=True, lam=0.9),
     TypeError, "gamma is True"),
    ("ref_numpy.whiten", "eps=nan", lambda: ref_numpy.whiten(LP, eps=float("nan")), ValueError,
     "eps is nan"),
    ("ref_numpy.whiten", "an all-masked batch", lambda: ref_numpy.whiten(LP, np.zeros((2, 3))),
     ValueError, "mask has 0 valid entries"),
    ("ref_numpy.whiten", "an unsigned-integer array", lambda: ref_numpy.whiten(
        np.ones((2, 3), dtype=np.uint8)), TypeError, "x has dtype uint8"),
    ("ref_numpy.group_advantages", "rewards as a Python list of ints",
     lambda: ref_numpy.group_advantages([1, 0], group_size=2), TypeError, "dtype int"),
    ("ref_torch.kl_penalty", "a NumPy array", lambda: ref_torch.kl_penalty(LP, LP), TypeError,
     "expects a torch.Tensor"),
    ("ref_torch.kl_penalty", "float32 beside float64",
     lambda: ref_torch.kl_penalty(torch.tensor(LP), torch.tensor(LP, dtype=torch.float32)),
     TypeError, "share one dtype"),
    ("ref_numpy.policy_objective", "agg='sum'", lambda: ref_numpy.policy_objective(
        LP, LP, LP, np.ones((2, 3), bool), agg="sum"), ValueError, "agg is 'sum'; expected one of"),
    ("ref_torch.policy_objective", "agg='sum'", lambda: ref_torch.policy_objective(
        torch.tensor(LP), torch.tensor(LP), torch.tensor(LP), torch.ones(2, 3, dtype=torch.bool),
        agg="sum"), ValueError, "agg is 'sum'; expected one of"),
    ("ref_torch.ppo_clip_loss", "meta tensors", lambda: ref_torch.ppo_clip_loss(
        *(torch.zeros(2, 3, dtype=torch.float64, device="meta"),) * 3), ValueError,
     "logp is on the meta device"),
    ("ref_torch.ppo_clip_loss", "one meta tensor among cpu ones", lambda: ref_torch.ppo_clip_loss(
        torch.tensor(LP), torch.zeros(2, 3, dtype=torch.float64, device="meta"),
        torch.tensor(LP)), ValueError, "old_logp is on the meta device"),
    ("crosscheck.audit", "a non-callable", lambda: audit(3, "whiten"), AuditUsageError,
     "expected a callable"),
    ("crosscheck.audit", "an unknown reference", lambda: audit(len, "grpo"), AuditUsageError,
     "ref is 'grpo'"),
    ("crosscheck.audit", "backend='jax'", lambda: audit(len, "whiten", backend="jax"),
     AuditUsageError, "backend is 'jax'"),
]


@pytest.mark.parametrize("entry, what, call, error, fragment", API,
                         ids=[f"{e}:{w}" for e, w, *_ in API])
def test_api_hostile_inputs(entry, what, call, error, fragment):
    with pytest.raises(error) as exc:
        call()
    assert fragment in str(exc.value)


# (command, exit code, fragment of stdout + stderr); exit 2 = usage error, 1 = a finding
CLI = [
    (["--cases", "abc"], 2, "invalid int value"),
    (["--cases", "0"], 2, "--cases is 0"),
    (["--seed", "-1"], 2, "--seed is -1"),
    (["--only", ""], 2, "--only names unknown function(s) (none)"),
    (["--only", "gae,nonesuch"], 2, "--only names unknown function(s) nonesuch; known: gae, "),
    (["--scale", "0"], 2, "--scale is 0"),
    (["--frobnicate"], 2, "unrecognized arguments"),
    (["explain", "--lang", "fr"], 2, "invalid choice: 'fr'"),
    (["explain", "--topic", "gae", "--plot", "/proc/nope"], 2, "cannot create its folder"),
    (["audit"], 2, "give a target"),
    (["audit", "nofile.py:f", "--ref", "whiten"], 2, "does not exist"),
    (["audit", f"{EX}/buggy.py:nope", "--ref", "whiten"], 2, "has no function 'nope'"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--set", "=1"], 2,
     "expected key=value"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--set", "nope=1"], 2,
     "'nope' is not a convention of kl_penalty"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--profile", "x"], 2,
     "invalid choice: 'x'"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--cases", "5"], 1,
     "DOES NOT CONFORM"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--accumulation",
      "max"], 2, "argument --accumulation: invalid choice: 'max'"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--accumulation",
      "sum", "--cases", "3"], 1, "DOES NOT CONFORM"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--timeout", "0"], 2,
     "--timeout is 0.0"),
    (["audit", f"{EX}/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--timeout", "nan"], 2,
     "--timeout is nan"),
]


@pytest.mark.parametrize("argv, code, fragment", CLI, ids=[" ".join(a) for a, *_ in CLI])
def test_cli_hostile_inputs(argv, code, fragment):
    got, out, err = run_cli(argv)
    assert got == code
    assert fragment in out + err
    assert "Traceback" not in out + err


def test_a_hanging_function_fails_the_audit_without_waiting_on_every_case():
    import threading

    from crosscheck import audit
    release = threading.Event()
    calls = []

    def hangs(logp, ref_logp, mask):
        calls.append(1)
        release.wait(60)
        return logp - ref_logp

    t0 = time.perf_counter()
    report = audit(hangs, "kl_penalty", cases=50, timeout=0.2, seed=3)
    release.set()
    assert not report.ok and len(calls) == 1 and report.seed == 3
    assert report.ref == "kl_penalty" and str(report).startswith("audit against kl_penalty")
    assert report.verdict == "INCONCLUSIVE" and not report.failures      # slow is not wrong
    assert "did not return within 0.2 s" in report.inconclusive[0]
    assert time.perf_counter() - t0 < 10
    with pytest.raises(ValueError, match="timeout is -1"):
        audit(hangs, "kl_penalty", timeout=-1)


def test_the_deadline_keeps_grad_mode_and_passes_errors_through():
    import torch

    from crosscheck.audit.calls import call_with_deadline
    with torch.no_grad():
        assert call_with_deadline(lambda: torch.is_grad_enabled(), {}, 5) is False
    assert call_with_deadline(lambda: torch.is_grad_enabled(), {}, 5) is True
    with pytest.raises(KeyError, match="boom"):
        call_with_deadline(lambda: {}["boom"], {}, 5)


def test_argparse_usage_errors_carry_a_message(capsys):
    from crosscheck import __main__ as cli
    with pytest.raises(SystemExit) as exc:
        cli.main(["--cases", "abc"])
    assert exc.value.code == 2
    assert "invalid int value: 'abc'" in capsys.readouterr().err


def test_user_functions_that_misbehave_are_reported_not_raised(tmp_path):
    target = tmp_path / "mine.py"
    target.write_text(
        "import torch\n"
        "def raises(**kw):\n    raise KeyError('boom')\n"
        "def string(**kw):\n    return 'not an array'\n"
        "def nan(logp, ref_logp, mask):\n    return logp * float('nan')\n"
        "def shape(logp, ref_logp, mask):\n    return logp[:, :1]\n"
        "def hangs(logp, ref_logp, mask):\n    import time\n    time.sleep(60)\n"
        "raise_on_import = None\n")
    for fn, check in (("raises", "FAIL raises"), ("string", "FAIL shape"),
                      ("nan", "FAIL finite"), ("shape", "FAIL shape")):
        code, out, _ = run_cli(["audit", f"{target}:{fn}", "--ref", "kl_penalty", "--cases", "5"])
        assert code == 1 and check in out, (fn, out)
    t0 = time.perf_counter()
    code, out, _ = run_cli(["audit", f"{target}:hangs", "--ref", "kl_penalty", "--timeout", "0.5"])
    assert code == 2 and "verdict: INCONCLUSIVE" in out and "did not return within 0.5 s" in out
    assert "FAIL" not in out
    assert time.perf_counter() - t0 < 30                     # stopped at the first hang
    bad = tmp_path / "broken.py"
    bad.write_text("import nonexistent_module_xyz\n")
    code, _, err = run_cli(["audit", f"{bad}:f", "--ref", "kl_penalty"])
    assert code == 2 and "importing" in err and "ModuleNotFoundError" in err


def _meta_call(name):
    """Call ref_torch.NAME on meta tensors shaped as the registry's first case."""
    from crosscheck.check import cases, registry
    entry = registry.build()[name]
    case = entry.case(cases.rng_for(0, name, 0), 0)
    meta = {k: (torch.zeros(v.shape, dtype=torch.bool if v.dtype == bool else torch.float64,
                            device="meta") if isinstance(v, np.ndarray) else v)
            for k, v in case.arrays.items()}
    return lambda: entry.torch_fn(**meta, **case.params)


@pytest.mark.parametrize("name", list(__import__("crosscheck.check.registry",
                                                 fromlist=["build"]).build()))
def test_every_torch_reference_refuses_meta_tensors_by_name(name):
    with pytest.raises(ValueError, match=r"^\w+ is on the meta device; ref_torch computes "):
        _meta_call(name)()


def _first_case(name):
    from crosscheck.check import cases, registry
    entry = registry.build()[name]
    return entry, entry.case(cases.rng_for(0, name, 0), 0)


def _outputs(out):
    """A function's outputs as a list of numpy arrays (dicts in key order, tuples in order)."""
    if isinstance(out, dict):
        out = [out[k] for k in sorted(out)]
    elif not isinstance(out, tuple):
        out = [out]
    return [o.detach().numpy() if isinstance(o, torch.Tensor) else np.asarray(o) for o in out]


REGISTRY = list(__import__("crosscheck.check.registry", fromlist=["build"]).build())
# the KL-estimator analyses take one categorical distribution [V], V ≥ 2: no batch to empty
BATCHED = [n for n in REGISTRY if not n.startswith("kl_estimator")]


def _per_sequence_only(name):
    """Every input is one value per sequence [B] (the outcome estimators): no T axis."""
    _, case = _first_case(name)
    return all(np.ndim(v) <= 1 for v in case.arrays.values() if isinstance(v, np.ndarray))


# B = 0 (axis 0) and T = 0 (axis 1, where there is one)
EMPTY = [(n, axis) for n in BATCHED for axis in (0, 1)
         if not (axis == 1 and _per_sequence_only(n))]


@pytest.mark.parametrize("name, axis", EMPTY)
def test_an_empty_batch_gives_the_same_empty_outputs_in_both_twins(name, axis):
    entry, case = _first_case(name)
    arrays = {k: (np.take(v, np.arange(0), axis=axis) if isinstance(v, np.ndarray) and
                  v.ndim > axis else v) for k, v in case.arrays.items()}
    got_np = _outputs(entry.numpy_fn(**arrays, **case.params))
    got_t = _outputs(entry.torch_fn(**{k: to_torch(v) for k, v in arrays.items()},
                                    **case.params))
    assert [o.shape for o in got_np] == [o.shape for o in got_t]
    for a, b in zip(got_np, got_t):
        np.testing.assert_array_equal(a, b)     # empty, or the 0 of an empty sum
        assert a.size == 0 or not np.any(a), (name, a)


@pytest.mark.parametrize("name", REGISTRY)
def test_every_torch_reference_gives_the_same_values_under_no_grad(name):
    entry, case = _first_case(name)
    call = lambda: _outputs(entry.torch_fn(      # noqa: E731
        **{k: to_torch(v) for k, v in case.arrays.items()}, **case.params))
    outside = call()
    with torch.no_grad():
        inside = call()
    for a, b in zip(outside, inside):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", REGISTRY)
def test_one_meta_tensor_among_cpu_ones_is_refused_by_name_in_every_torch_reference(name):
    entry, case = _first_case(name)
    arrays = {k: to_torch(v) for k, v in case.arrays.items()}
    target = entry.diff[0] if entry.diff else next(k for k, v in arrays.items()
                                                   if isinstance(v, torch.Tensor))
    arrays[target] = torch.zeros(arrays[target].shape, dtype=arrays[target].dtype,
                                 device="meta")
    with pytest.raises(ValueError, match=rf"^{target} is on the meta device"):
        entry.torch_fn(**arrays, **case.params)


@pytest.mark.parametrize("B, T", [(0, 5), (3, 0)])
def test_gae_of_an_empty_batch_is_empty_in_both_twins(B, T):
    r = np.zeros((B, T))
    m = np.zeros((B, T), bool)
    for out in (ref_numpy.gae(r, r, m, gamma=0.99, lam=0.95),
                ref_torch.gae(torch.tensor(r), torch.tensor(r), torch.tensor(m), gamma=0.99,
                              lam=0.95)):
        assert [tuple(o.shape) for o in out] == [(B, T), (B, T)]


def test_the_torch_estimator_gradient_works_under_no_grad():
    logits = torch.tensor([0.1, 0.3, -0.2], dtype=torch.float64)
    ref = torch.tensor([0.5, -0.1, 0.0], dtype=torch.float64)
    with torch.no_grad():
        got = ref_torch.kl_estimator_gradient(logits, ref, kind="k3")
        assert not torch.is_grad_enabled()                 # the caller's mode is kept
    want = ref_numpy.kl_estimator_gradient(logits.numpy(), ref.numpy(), kind="k3")
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k], rtol=1e-12, atol=1e-15)
