"""The registry, ref_numpy.__all__ and ref_torch.__all__ match one-to-one, with equal signatures."""
import inspect

import pytest

import ref_numpy
import ref_torch
from crosscheck.check import registry


def test_registry_matches_both_all_lists():
    entries = registry.build()
    names = list(entries)
    with_vjp = [n + "_vjp" for n, e in entries.items() if e.numpy_vjp is not None]
    assert sorted(ref_torch.__all__) == sorted(names)
    assert sorted(ref_numpy.__all__) == sorted(names + with_vjp)
    # only a function whose value is itself a gradient (checked against autograd and finite
    # differences of its objective), a count, stop-gradient weights and masks (comparisons,
    # not differentiated) go without a VJP
    assert [n for n, e in entries.items() if e.numpy_vjp is None] == \
        ["kl_estimator_gradient", "clip_fraction", "rollout_is_weights", "opsm_mask",
         "m2po_mask", "fipo_influence_weights", "tv_filter_mask"]
    assert entries["kl_estimator_gradient"].objectives is not None
    for name in ("clip_fraction", "rollout_is_weights", "opsm_mask", "m2po_mask",
                 "fipo_influence_weights", "tv_filter_mask"):
        assert entries[name].diff == () and not entries[name].trainer_grad, name


def test_twins_have_identical_signatures():
    for name in registry.build():
        assert inspect.signature(getattr(ref_numpy, name)) == \
            inspect.signature(getattr(ref_torch, name)), name


def test_vjp_signature_is_g_then_the_function_signature():
    for name, e in registry.build().items():
        if e.numpy_vjp is None:
            continue
        fn = inspect.signature(getattr(ref_numpy, name))
        vjp = inspect.signature(getattr(ref_numpy, name + "_vjp"))
        params = list(vjp.parameters.values())
        assert params[0].name == "g" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert params[1:] == list(fn.parameters.values()), name


def test_vjp_docstrings_derive_the_gradient():
    for name, e in registry.build().items():
        if not e.diff:
            continue                              # a count: nothing to differentiate
        doc = (e.numpy_vjp or e.numpy_fn).__doc__
        assert "Gradient:" in doc, name


def test_hyper_parameters_are_keyword_only():
    arrays = {"rewards", "values", "mask", "x", "logp", "old_logp", "advantages", "old_values",
              "returns", "ref_logp", "loss", "dones", "last_value", "group_ids", "logits",
              "ref_logits", "valid", "rollout_logp", "scores", "lengths", "baselines",
              "sum_pi_squared", "prox_logp", "behave_logp"}
    for name in registry.build():
        for p in inspect.signature(getattr(ref_numpy, name)).parameters.values():
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                assert p.name in arrays, f"{name}: {p.name} should be keyword-only"


def test_every_entry_declares_inputs_that_exist():
    for name, e in registry.build().items():
        params = inspect.signature(e.numpy_fn).parameters
        assert all(d in params for d in e.diff), name
        if e.numpy_vjp is not None:
            assert set(inspect.signature(e.numpy_vjp).parameters) >= set(params), name


@pytest.mark.parametrize("name", sorted(registry.build()))
def test_the_twins_share_every_default(name):
    """A default is a convention: the NumPy reference and its torch twin must agree on each."""
    sig_np = inspect.signature(getattr(ref_numpy, name)).parameters
    sig_t = inspect.signature(getattr(ref_torch, name)).parameters
    assert list(sig_np) == list(sig_t)
    for p in sig_np:
        assert sig_np[p].default == sig_t[p].default, (name, p)


@pytest.mark.parametrize("name", sorted(n for n, e in registry.build().items()
                                        if e.numpy_vjp is not None))
def test_each_vjp_shares_its_functions_defaults(name):
    fn = inspect.signature(getattr(ref_numpy, name)).parameters
    vjp = inspect.signature(getattr(ref_numpy, name + "_vjp")).parameters
    for p in fn:
        if p in vjp:
            assert vjp[p].default == fn[p].default, p
