"""Every argument of every reference is named in the error a wrong type or shape gets: the
message is how a user finds their bug, so it is tested argument by argument, in both twins."""
import inspect
import re

import numpy as np
import pytest

from crosscheck.bridge import to_torch
from crosscheck.check import cases, registry

ENTRIES = registry.build()


def case0(name):
    """Each reference's first seeded case: every argument it uses, with valid values."""
    return ENTRIES[name].case(cases.rng_for(0, name, 0), 0)


PAIRS = [(name, arg) for name in sorted(ENTRIES) for arg in case0(name).arrays]
ARRAY_PAIRS = [(n, a) for n, a in PAIRS          # those holding an array (not None) in case 0
               if isinstance(case0(n).arrays[a], np.ndarray)]


def call(entry, twin, arrays, params):
    if twin == "numpy":
        return entry.numpy_fn(**arrays, **params)
    return entry.torch_fn(**to_torch(arrays), **params)


def named(arg, message):
    """`arg` as a whole word: `logp` must not pass for a message about `old_logp`."""
    return re.search(rf"(?<![\w]){re.escape(arg)}(?![\w])", message) is not None


@pytest.mark.parametrize("twin", ["numpy", "torch"])
@pytest.mark.parametrize("name, arg", PAIRS, ids=[f"{n}-{a}" for n, a in PAIRS])
def test_a_wrong_type_names_the_argument(name, arg, twin):
    entry = ENTRIES[name]
    case = case0(name)
    others = {k: v for k, v in case.arrays.items() if k != arg}
    fn = entry.numpy_fn if twin == "numpy" else entry.torch_fn
    with pytest.raises((TypeError, ValueError)) as exc:     # group_ids with group_size: both
        fn(**(others if twin == "numpy" else to_torch(others)), **{arg: "oops"}, **case.params)
    assert named(arg, str(exc.value)), str(exc.value)


@pytest.mark.parametrize("twin", ["numpy", "torch"])
@pytest.mark.parametrize("name, arg", ARRAY_PAIRS, ids=[f"{n}-{a}" for n, a in ARRAY_PAIRS])
def test_a_wrong_shape_names_the_argument(name, arg, twin):
    entry = ENTRIES[name]
    case = case0(name)
    arrays = dict(case.arrays)
    v = arrays[arg]
    arrays[arg] = np.zeros(v.shape + (3,), dtype=v.dtype)        # one axis too many
    with pytest.raises(ValueError) as exc:
        call(entry, twin, arrays, case.params)
    assert named(arg, str(exc.value)), str(exc.value)


FLOAT_PAIRS = [(n, a) for n, a in ARRAY_PAIRS
               if case0(n).arrays[a].dtype.kind == "f"]


@pytest.mark.parametrize("twin", ["numpy", "torch"])
@pytest.mark.parametrize("name, arg", FLOAT_PAIRS, ids=[f"{n}-{a}" for n, a in FLOAT_PAIRS])
def test_a_nan_at_a_valid_position_names_the_argument(name, arg, twin):
    entry = ENTRIES[name]
    case = case0(name)
    arrays = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in case.arrays.items()}
    x, m = arrays[arg], arrays.get("mask")
    valid = m if m is not None and m.shape == x.shape else np.ones(x.shape, dtype=bool)
    x[np.unravel_index(int(np.flatnonzero(valid)[0]), x.shape)] = np.nan
    with pytest.raises(ValueError) as exc:
        call(entry, twin, arrays, case.params)
    assert named(arg, str(exc.value)) and "nan" in str(exc.value), str(exc.value)


@pytest.mark.parametrize("name, arg", ARRAY_PAIRS, ids=[f"{n}-{a}" for n, a in ARRAY_PAIRS])
def test_a_shape_error_names_only_real_arguments(name, arg):
    """'X has shape … but Y has …': both X and Y are parameters of the function called."""
    entry = ENTRIES[name]
    case = case0(name)
    arrays = dict(case.arrays)
    arrays[arg] = np.zeros(arrays[arg].shape + (3,), dtype=arrays[arg].dtype)
    with pytest.raises(ValueError) as exc:
        call(entry, "numpy", arrays, case.params)
    message = str(exc.value)
    mentioned = re.findall(r"(\w+) has shape", message) + re.findall(r"but (\w+) has", message)
    params = set(inspect.signature(entry.numpy_fn).parameters)
    assert set(mentioned) <= params, message


VJP_NAMES = sorted(n for n, e in ENTRIES.items() if e.numpy_vjp is not None)


@pytest.mark.parametrize("name", VJP_NAMES)
def test_a_wrong_cotangent_names_g(name):
    entry = ENTRIES[name]
    case = case0(name)
    with pytest.raises((TypeError, ValueError)) as exc:
        entry.numpy_vjp(np.zeros((2, 3, 4, 5)), **case.arrays, **case.params)
    message = str(exc.value)
    assert named("g", message), message
    mentioned = re.findall(r"(\w+) has shape", message) + re.findall(r"but (\w+) has", message)
    assert set(mentioned) <= set(inspect.signature(entry.numpy_vjp).parameters), message


KEYWORD_CASES = [(name, p) for name, e in sorted(ENTRIES.items())
                 for p, prm in inspect.signature(e.numpy_fn).parameters.items()
                 if prm.kind == prm.KEYWORD_ONLY and isinstance(prm.default, float)]


@pytest.mark.parametrize("twin", ["numpy", "torch"])
@pytest.mark.parametrize("name, key", KEYWORD_CASES, ids=[f"{n}-{k}" for n, k in KEYWORD_CASES])
def test_a_nan_hyper_parameter_is_refused_by_name(name, key, twin):
    entry = ENTRIES[name]
    case = case0(name)
    params = dict(case.params, **{key: float("nan")})
    with pytest.raises((TypeError, ValueError)) as exc:
        call(entry, twin, case.arrays, params)
    assert named(key, str(exc.value)), str(exc.value)


OPTIONAL_CASES = [(name, p) for name, e in sorted(ENTRIES.items())
                  for p, prm in inspect.signature(e.numpy_fn).parameters.items()
                  if prm.kind == prm.KEYWORD_ONLY and prm.default is None
                  and p not in case0(name).arrays]          # hyper-parameters, not data


@pytest.mark.parametrize("twin", ["numpy", "torch"])
@pytest.mark.parametrize("name, key", OPTIONAL_CASES, ids=[f"{n}-{k}" for n, k in OPTIONAL_CASES])
def test_an_optional_hyper_parameter_set_to_nan_is_refused_by_its_own_name(name, key, twin):
    """clip_high, clip_c, delta, kl_clamp, ... default to None (off); NaN is not "off", and the
    error uses the caller's keyword (policy_objective's kl_clamp, not kl_penalty's clamp)."""
    entry = ENTRIES[name]
    case = case0(name)
    with pytest.raises((TypeError, ValueError)) as exc:
        call(entry, twin, case.arrays, dict(case.params, **{key: float("nan")}))
    assert named(key, str(exc.value)), str(exc.value)


CHOICE_CASES = [(name, p) for name, e in sorted(ENTRIES.items())
                for p, prm in inspect.signature(e.numpy_fn).parameters.items()
                if prm.kind == prm.KEYWORD_ONLY and p not in e.data_keywords
                and any(isinstance(v, str) for v in (prm.default,) + tuple(e.grid.get(p, ())))]


@pytest.mark.parametrize("twin", ["numpy", "torch"])
@pytest.mark.parametrize("name, key", CHOICE_CASES, ids=[f"{n}-{k}" for n, k in CHOICE_CASES])
def test_an_unknown_choice_is_refused_by_the_callers_own_keyword(name, key, twin):
    """A keyword that picks one of several conventions (decoupled_ppo_loss's is_seq_stat,
    is_mode, ...) refused under the caller's name, not the name of the function it forwards to
    (seq_stat)."""
    entry = ENTRIES[name]
    case = case0(name)
    with pytest.raises((TypeError, ValueError)) as exc:
        call(entry, twin, case.arrays, dict(case.params, **{key: "geo"}))
    assert named(key, str(exc.value)), str(exc.value)


def test_policy_objective_names_its_own_kl_keywords():
    import ref_numpy
    case = case0("policy_objective")
    for key, value in (("kl_kind", "k9"), ("kl_clamp", (1.0,)), ("kl_clamp", (-1.0, None))):
        with pytest.raises(ValueError) as exc:
            ref_numpy.policy_objective(**case.arrays, **dict(case.params, **{key: value}))
        assert named(key, str(exc.value)) or named(key + "[0]", str(exc.value)), str(exc.value)


@pytest.mark.parametrize("name", VJP_NAMES)
def test_a_cotangent_of_the_wrong_type_names_g(name):
    entry = ENTRIES[name]
    case = case0(name)
    g = np.array([["a"]])
    with pytest.raises(TypeError) as exc:
        entry.numpy_vjp((g, g) if name == "gae" else g, **case.arrays, **case.params)
    assert named("g", str(exc.value)) or named("g[0]", str(exc.value)), str(exc.value)


def test_gae_vjp_names_both_cotangents_and_what_they_must_match():
    import ref_numpy
    r = np.zeros((2, 3))
    for k, bad in ((0, (np.zeros((2, 4)), r)), (1, (r, np.zeros((2, 4))))):
        with pytest.raises(ValueError) as exc:
            ref_numpy.gae_vjp(bad, r, r, gamma=0.9, lam=0.9)
        assert str(exc.value).startswith(f"g[{k}] has shape (2, 4) but rewards has (2, 3)")
