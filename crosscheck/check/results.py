"""What a stage check records: one `StageResult` per function and stage, updated case by case."""
import dataclasses
import math
from typing import Dict

STAGES = ("value", "vjp", "fd", "detach")


@dataclasses.dataclass
class StageResult:
    name: str
    stage: str
    status: str = "pass"          # "pass" | "fail"
    cases: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    worst: Dict[str, object] = dataclasses.field(default_factory=dict)
    badness: float = -1.0         # err / allowed, of the worst comparison so far

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def record(res: StageResult, cmp, info: Dict[str, object]) -> None:
    """Fold one comparison (a bridge.Comparison) into `res`: the largest errors, the verdict, and
    the worst entry so far (a failing one always wins over a passing one)."""
    res.max_abs_err = max(res.max_abs_err, cmp.max_abs)
    res.max_rel_err = max(res.max_rel_err, cmp.max_rel)
    if not cmp.ok:
        res.status = "fail"
    if cmp.badness > res.badness and (res.status == "pass" or not cmp.ok):
        res.badness = cmp.badness
        res.worst = dict(info, index=list(cmp.index), got=cmp.got, expected=cmp.expected,
                         abs_err=abs(cmp.got - cmp.expected) if cmp.ok or math.isfinite(
                             cmp.got - cmp.expected) else math.inf,
                         allowed=cmp.allowed)


def fail(res: StageResult, info: Dict[str, object], message: str) -> None:
    """A failure that is not a numeric comparison (an exception, a NaN, a leak at padding)."""
    res.status = "fail"
    res.max_abs_err = math.inf
    if res.badness < math.inf:
        res.badness = math.inf
        res.worst = dict(info, message=message)
