"""crosscheck: verify the RL math of LLM trainers against two independent references.

`python -m crosscheck` runs the harness; see README.md.
"""
from .registry import REGISTRY, Entry, build

__all__ = ["REGISTRY", "Entry", "build"]
