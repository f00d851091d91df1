"""Printing results: a table for people, one JSON object for programs."""
import json
from typing import List

from ..bridge import json_safe
from .results import StageResult


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


def failure_message(r: StageResult) -> str:
    """One readable paragraph: function, stage, input, seed, case, shape, worst index, values."""
    w = r.worst
    head = (f"FAIL {r.name} · {r.stage} · input {w.get('input', '?')} · seed {w.get('seed')} · "
            f"case {w.get('case')} ({w.get('label', '')}) · shape {tuple(w.get('shape', ()))}")
    if "message" in w:
        body = w["message"]
    else:
        where = w.get("input_index", w.get("index"))
        if "output_index" in w:
            where = f"d{w['output_index'][0]}{w['output_index'][1:]} / d{w.get('input')}{where}"
        body = (f"worst at {where} ({w.get('mode', 'element-wise')}): "
                f"{w.get('got_from')} = {w.get('got'):.12g}, {w.get('expected_from')} = "
                f"{w.get('expected'):.12g} (|diff| {w.get('abs_err'):.3g} > allowed "
                f"{w.get('allowed'):.3g})")
    return (f"{head}\n    {body}\n    reproduce: python -m crosscheck --only {r.name} "
            f"--seed {w.get('seed')}")


def failures(results: List[StageResult]) -> str:
    return "\n".join(failure_message(r) for r in results if not r.passed)


def summary(results: List[StageResult], n_functions: int, seed: int, n_cases: int,
            seconds: float) -> str:
    n_fail = sum(not r.passed for r in results)
    verdict = "all passed" if n_fail == 0 else f"{n_fail} FAILED"
    return (f"{n_functions} function{'s' * (n_functions != 1)}, {len(results)} stage checks: "
            f"{verdict} "
            f"(seed {seed}, {n_cases} case{'s' * (n_cases != 1)} each, {seconds:.1f} s)")
