"""crosscheck: verify the RL math of LLM trainers against two independent references.

`python -m crosscheck` runs the harness; see README.md.
"""
from .audit import AuditReport, assert_conforms, audit
from .registry import REGISTRY, Entry, build

__all__ = ["REGISTRY", "Entry", "build", "audit", "assert_conforms", "AuditReport"]
