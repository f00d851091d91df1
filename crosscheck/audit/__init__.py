"""The audit: check a trainer's own function against a reference (`crosscheck.audit`).

`api` holds the entry points; `auditor` the checks of one case; `properties` the checks beyond
one case (group permutation, micro-batch accumulation, KL direction); `shrink` the minimal
counterexample; `diagnose` what a failing function most likely computes; `profiles` the
trainers' conventions; `calls` how the user's function is called; `model` the report.
Importing this package does not import torch.
"""
from .api import assert_conforms, audit
from .model import AuditReport, AuditUsageError, Finding

__all__ = ["audit", "assert_conforms", "AuditReport", "AuditUsageError", "Finding"]
