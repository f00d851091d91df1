"""Hypothesis profiles: "ci" (the default) is derandomized, so a run is reproducible and CI never
flakes on a new random example; "explore" searches further with fresh randomness:
    HYPOTHESIS_PROFILE=explore python -m pytest tests/test_properties.py
Any failure it finds shrinks to a minimal example, to be kept as a regression fixture."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.register_profile("explore", deadline=None, max_examples=400,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    """A private generator for tests drawing random inputs (a fixed seed: reproducible)."""
    return np.random.default_rng(20261202)
