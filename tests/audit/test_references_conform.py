"""A reference conforms to its own audit: each torch twin, through a thin adapter that passes
the audit's keyword arguments through, is audited against its own registry entry."""
import inspect

import pytest

import ref_torch
from crosscheck import audit
from crosscheck.check.registry import REGISTRY

# conventions without a default: bound inside the adapter, and declared to the audit
REQUIRED = dict(gae=dict(gamma=0.99, lam=0.95), discounted_returns=dict(gamma=0.99),
                kl_estimator_moments=dict(kind="k3"), kl_estimator_gradient=dict(kind="k3"))
CASES = 24          # past the default run's 12: the large-offset and extreme regimes too


def thin_adapter(name, conventions):
    """ref_torch.<name> taking the reference's data inputs by keyword (None: not given), the
    conventions bound; given both group_size and the group_ids derived from it, the twin takes
    one, as the reference does."""
    entry = REGISTRY[name]
    fn = getattr(ref_torch, name)
    sig = inspect.signature(entry.numpy_fn).parameters
    names = [n for n, p in sig.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    names += [n for n in entry.data_keywords if n not in names]

    def adapter(**kwargs):
        given = {k: v for k, v in kwargs.items() if v is not None}
        if "group_size" in given:
            given.pop("group_ids", None)
        return fn(**given, **conventions)
    adapter.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in names])
    return adapter


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_torch_twin_conforms_to_its_own_registry_entry(name):
    conventions = REQUIRED.get(name, {})
    # the twin takes no global counts: an optimizer step per batch, no micro-batches
    report = audit(thin_adapter(name, conventions), name, cases=CASES,
                   accumulation="none" if "microbatch" in REGISTRY[name].checks else None,
                   **conventions)
    assert report.verdict == "CONFORMS", str(report)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_the_moments_twin_returning_log_var_conforms(kind):
    """kl_estimator_moments returns log_var beside the five figures: an extra key the audit
    compares from the first case on, never a shape failure."""
    report = audit(thin_adapter("kl_estimator_moments", dict(kind=kind)),
                   "kl_estimator_moments", cases=CASES, kind=kind)
    assert report.verdict == "CONFORMS", str(report)
