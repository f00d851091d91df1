"""A saved card as a baseline: which findings of a card are new since it, which it holds, and
which of its findings are gone (`python -m crosscheck trainer NAME --baseline FILE`).

A baseline is what `trainer NAME --json` prints (one card), what `trainer --all --json` prints
(a list of cards), or a folder of such files; its cards are matched to the trainers by name.

A finding is matched by its **signature**, never by its check's name alone: the row, the
check, the grade, how it was explained (new, or the known entry whose variant reproduced it),
the diagnosis (what the function most likely computes), where the first failure is (the output,
or the gradient wrt which input), how the trainer's output relates to the reference's on the
minimal counterexample (a common factor rounded to two significant digits, zero, or not a
scaling) and the counterexample's class (how its rows are grouped). No raw digits enter it, so
that a baseline written on another machine, whose kernels round the last digits otherwise,
still matches; a second bug at a row that already fails changes the relation, the place, the
diagnosis or the class, and is new. Where it changes none of them (two bugs whose outputs are
both "not a scaling" of the reference's), the finding is new all the same when the row's code,
replayed on the baseline finding's minimal counterexample, no longer gives the output saved
with it (beyond the trainer's precision row of the tolerance table).
"""
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
# the outputs a check's counterexample compares, by check: (the trainer's, the reference's)
COMPARED = {"grad": ("your gradient", "reference gradient")}
OUTPUTS = ("your output", "reference output")


class BaselineError(ValueError):
    """A baseline that cannot be read (a usage error of the command line)."""


def _rounded(match) -> str:
    x = float(match.group(0))
    return f"{x:.2g}"


def _flat(v) -> Optional[List[float]]:
    """The numbers of a counterexample's output (nested lists, a number, "nan"), or None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return [float(v)]
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return [float(v)]
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            got = _flat(x)
            if got is None:
                return None
            out += got
        return out
    return None


def relation(yours, reference) -> str:
    """How the trainer's output relates to the reference's: "×k" (one factor k over every
    element, rounded to two significant digits: ×-1 a flipped sign, ×0 a zeroed output),
    "×(1-1e-04)" where k is within 5 % of 1 (the decade of its difference: 1.5e-4 and 9e-4
    both read 1e-04), "not a scaling",
    "non-finite", or "" where there is nothing to compare."""
    y, r = _flat(yours), _flat(reference)
    if y is None or r is None or len(y) != len(r) or not y:
        return ""
    if not all(math.isfinite(v) for v in y + r):
        return "non-finite"
    scale = max(abs(v) for v in y + r) or 1.0
    tiny = 1e-9 * scale
    factors = [a / b for a, b in zip(y, r) if abs(b) > tiny]
    if not factors or any(abs(a) > tiny for a, b in zip(y, r) if abs(b) <= tiny):
        return "not a scaling"
    k = factors[0]
    if any(abs(f - k) > 1e-3 * max(abs(k), 1e-12) + 1e-9 for f in factors):
        return "not a scaling"
    if abs(k) < 1e-6:
        return "×0"
    if abs(k - 1) < 0.05:          # a small difference: its decade, which rounding moves
        d = k - 1                  # only at a power of ten (a digit would move at every half)
        return f"×(1{'+' if d > 0 else '-'}1e{math.floor(math.log10(abs(d)) + 1e-9):+03d})" if d \
            else "×1"
    return f"×{k:.2g}"


def counterexample_class(ce: Mapping) -> str:
    """The class of a minimal counterexample, without its numbers: how its rows are grouped
    (`group_ids`: one group, groups of equal or unequal sizes, with a group of one). A bug
    that needs unequal groups and one whose counterexample is a single group are two findings,
    whatever their relation; "" where the counterexample holds no groups."""
    ids = ce.get("group_ids")
    if not isinstance(ids, (list, tuple)) or not ids:
        return ""
    sizes = {}
    for g in ids:
        sizes[str(g)] = sizes.get(str(g), 0) + 1
    counts = set(sizes.values())
    kind = "one group" if len(sizes) == 1 else \
        "groups of equal sizes" if len(counts) == 1 else "groups of unequal sizes"
    return kind + (", a group of one" if 1 in counts and len(sizes) > 1 else "")


def where(message: str) -> str:
    """The place of the first failure, without indices or numbers: "output", "d/dlogp
    (random cotangent)", "padding with NaN makes your function ..."."""
    head = message.split(": yours", 1)[0].split(":", 1)[0]
    head = re.sub(r"\[[^\]]*\]", "", head)
    return re.sub(r"\s+", " ", NUMBER.sub("#", head)).strip()


def signature(row: str, finding: Mapping) -> str:
    """A finding's signature (see the module docstring), from a card's finding or its JSON."""
    from ..bridge import json_safe
    ce = json_safe(finding.get("counterexample") or {})
    mine, ref = COMPARED.get(finding["check"], OUTPUTS)
    how = "new"
    if finding.get("known"):       # the known entry that reproduced it, by what it says
        how = NUMBER.sub(_rounded, str(finding.get("explanation", "")).split(" (", 1)[0][:80])
    diagnosis = NUMBER.sub(_rounded, str(finding.get("diagnosis") or ""))
    parts = [row, finding["check"], finding.get("grade", "deviation"), how] + \
        ([f"likely {diagnosis}"] if diagnosis else []) + \
        [where(str(finding.get("message", ""))), relation(ce.get(mine), ce.get(ref)),
         counterexample_class(ce)]
    return " | ".join(p for p in parts if p)


def row_name(row: Mapping) -> str:
    """A JSON row's name as the card prints it: function [label]."""
    return row["function"] + (f" [{row['label']}]" if row.get("label") else "")


def card_signatures(card: Mapping) -> Dict[str, dict]:
    """{signature: {row, check, grade, new}} of a card's deviations (its JSON form)."""
    out = {}
    for row in card.get("rows", []):
        for f in row.get("findings", []):
            if f.get("grade") != "deviation":
                continue
            out[signature(row_name(row), f)] = dict(row=row_name(row), check=f["check"],
                                                    grade=f["grade"], new=not f.get("known"))
    return out


def load(path: str) -> Dict[str, dict]:
    """{trainer name: its card (JSON)} from a baseline file (one card, or a list of cards) or a
    folder of them. BaselineError where it cannot be read, or holds no card."""
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
    elif not os.path.exists(path):
        raise BaselineError(f"--baseline {path!r} does not exist; expected a card saved with "
                            f"--json, or a folder of them")
    cards: Dict[str, dict] = {}
    for name in files:
        try:
            with open(name, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise BaselineError(f"--baseline {name!r} is not a card's JSON ({exc})") from None
        for c in data if isinstance(data, list) else [data]:
            if not isinstance(c, dict) or "trainer" not in c or "rows" not in c:
                raise BaselineError(f"--baseline {name!r} holds something other than a card "
                                    f"(expected what `trainer NAME --json` prints)")
            cards[c["trainer"]] = c
    if not cards:
        raise BaselineError(f"--baseline {path!r} holds no card (no .json file in the folder)")
    return cards


@dataclass
class Comparison:
    """A card against its baseline: its deviations new since the baseline and those the
    baseline holds (as (row name, finding) pairs), and the baseline's deviations no longer
    found."""
    source: str                                  # the baseline's file, and its version
    version: Optional[str]
    new: List[Tuple[str, dict]] = field(default_factory=list)
    held: List[Tuple[str, dict]] = field(default_factory=list)
    gone: List[dict] = field(default_factory=list)

    @property
    def gates(self) -> bool:
        """Whether a new (unexplained) deviation is new since the baseline: exit 1."""
        return any(not f["known"] for _, f in self.new)

    def to_dict(self):
        return dict(file=self.source, version=self.version,
                    new=[dict(row=r, check=f["check"], known=f["known"],
                              signature=f["signature"],
                              **({"since": f["since"]} if f.get("since") else {}))
                         for r, f in self.new],
                    in_baseline=[dict(row=r, check=f["check"], signature=f["signature"])
                                 for r, f in self.held],
                    fixed=self.gone)


def _numbers(v) -> Optional[List[float]]:
    """The numbers of a counterexample's output, a dict of outputs in its order, or None."""
    if isinstance(v, dict):
        out = []
        for x in v.values():
            got = _flat(x)
            if got is None:
                return None
            out += got
        return out
    return _flat(v)


def changed(replay, finding: Mapping, tol) -> str:
    """What the trainer's code computes now on a saved finding's minimal counterexample, where
    that is no longer the output saved with it (beyond `tol`, a Tolerance: another machine's
    last digits stay within it), or "" (the same, or nothing to replay). `replay(inputs)`: the
    row's outputs on a counterexample's inputs."""
    ce = finding.get("counterexample") or {}
    saved = _numbers(ce.get("your output"))
    if replay is None or saved is None:
        return ""
    try:
        now = _numbers(replay(ce))
    except ImportError:                  # a lazy import outside the card's loading: no replay
        return ""
    except Exception as exc:                       # noqa: BLE001 (the trainer's code raising)
        return (f"on the baseline's counterexample it now raises {type(exc).__name__}: "
                f"{str(exc)[:120]}")
    if now is None or len(now) != len(saved):
        return "on the baseline's counterexample its output now has another shape"
    for i, (a, b) in enumerate(zip(now, saved)):
        if math.isnan(a) and math.isnan(b) or a == b:
            continue
        if not (math.isfinite(a) and math.isfinite(b)) or \
                abs(a - b) > tol.atol + tol.rtol * abs(b):
            return (f"on the baseline's counterexample its output[{i}] is now {a:.10g}, where "
                    f"the baseline's code gave {b:.10g}")
    return ""


def compare(rows, baseline: Optional[Mapping], source: str, replayed=None) -> Comparison:
    """`rows`: (row name, finding) of a card's deviations, each finding with its "signature";
    `baseline`: the baseline's card of the same trainer (JSON), or None (none saved: every
    deviation is new). `replayed(row name, saved finding)`: what the row's code now computes
    otherwise on the saved finding's counterexample, or "": a finding whose signature the
    baseline holds is new all the same where it does (a second bug at a row that already
    failed the same check, in the same place, with the same relation)."""
    before = card_signatures(baseline) if baseline else {}
    saved = {}
    for row in (baseline or {}).get("rows", []):
        for f in row.get("findings", []):
            if f.get("grade") == "deviation":
                saved.setdefault(signature(row_name(row), f), f)
    out = Comparison(source, baseline.get("version") if baseline else None)
    seen = set()
    for name, f in rows:
        seen.add(f["signature"])
        if f["signature"] not in before:
            out.new.append((name, f))
            continue
        why = replayed(name, saved[f["signature"]]) if replayed is not None else ""
        if why:
            out.new.append((name, dict(f, since=why)))
            seen.discard(f["signature"])            # the baseline's finding is not found
        else:
            out.held.append((name, f))
    out.gone = [dict(v, signature=s) for s, v in before.items() if s not in seen]
    return out
