"""Printing results: a table for people, one JSON object for programs (SPEC §4)."""
import json
import math
from typing import List

import numpy as np

from .harness import StageResult, failure_message


def json_safe(v):
    """Plain JSON values: NumPy arrays become lists (0-d: a number), NumPy scalars Python ones,
    non-finite floats the strings "nan", "inf", "-inf"; dicts, lists and tuples recursively."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def to_json(results: List[StageResult], seed: int) -> str:
    doc = {
        "passed": all(r.passed for r in results),
        "seed": seed,
        "results": [
            {"name": r.name, "stage": r.stage, "status": r.status, "cases": r.cases,
             "max_abs_err": r.max_abs_err, "max_rel_err": r.max_rel_err, "worst": r.worst}
            for r in results
        ],
    }
    return json.dumps(json_safe(doc), indent=2, sort_keys=False, ensure_ascii=False)


def table(results: List[StageResult]) -> str:
    w = max([22] + [len(r.name) for r in results])
    head = f"{'function':<{w}} {'stage':<7} {'status':<6} {'cases':>5} {'max abs err':>12} " \
           f"{'max rel err':>12}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.name:<{w}} {r.stage:<7} {r.status.upper():<6} {r.cases:>5} "
                     f"{r.max_abs_err:>12.2e} {r.max_rel_err:>12.2e}")
    return "\n".join(lines)


def failures(results: List[StageResult]) -> str:
    return "\n".join(failure_message(r) for r in results if not r.passed)


def summary(results: List[StageResult], n_functions: int, seed: int, n_cases: int,
            seconds: float) -> str:
    n_fail = sum(not r.passed for r in results)
    verdict = "all passed" if n_fail == 0 else f"{n_fail} FAILED"
    return (f"{n_functions} function{'s' * (n_functions != 1)}, {len(results)} stage checks: "
            f"{verdict} "
            f"(seed {seed}, {n_cases} cases each, {seconds:.1f} s)")
