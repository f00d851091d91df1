"""ref_common: the contract both reference twins implement, in plain Python (no NumPy, no torch).

- `vocab`: every convention keyword's allowed values, written once;
- `checks`: validators that turn a bad argument into a `ValueError` / `TypeError` naming it,
  what was seen and what was expected;
- `args`: one argument parser per equation. A twin describes its arrays through a small `Ops`
  object (shape, kind, how to test a mask or finiteness) and validates a call in one line.

It holds no math: each twin computes everything itself.
"""
