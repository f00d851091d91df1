"""crosscheck: verify the RL math of LLM trainers against two independent references.

- `crosscheck.check`: the cross-check of the two twins and finite differences
  (`python -m crosscheck`);
- `crosscheck.audit`: a user's own function against a reference (`audit`, `assert_conforms`);
- `crosscheck.explain`: the walkthrough;
- `crosscheck.bridge` and `crosscheck.tolerances`: conversion, closeness, the tolerance table.

Importing crosscheck does not import torch; the registry loads on first use.
"""
__version__ = "0.1.0"          # setup.cfg reads it from here
from .audit import AuditReport, assert_conforms, audit

__all__ = ["REGISTRY", "Entry", "build", "audit", "assert_conforms", "AuditReport"]


def __getattr__(name):
    if name in ("REGISTRY", "Entry", "build"):
        from .check import registry
        return getattr(registry, name)
    raise AttributeError(f"module 'crosscheck' has no attribute {name!r}")
