"""Draw a seeded, stratified sample of mutmut's mutants (docs/mutation.md), and report it.

    mutmut run 'zzz_none*'                       # generate the mutants and the test stats only
    python scripts/mutation_sample.py --seed S > sample.txt
    mutmut run $(cat sample.txt)                 # run exactly the sample
    python scripts/mutation_sample.py --report sample.txt

The strata are the report-card package (`crosscheck/trainer/`), `ref_numpy/outcome.py`, the
newer loss families (`ref_numpy/pg_losses.py` and the SAPO and VESPO functions of
`ref_numpy/policy_losses.py`) and the rest of `ref_common/`, `ref_numpy/` and `crosscheck/`.
One `random.Random(seed)` draws from each stratum's sorted mutant names, in that order.
"""
import argparse
import collections
import glob
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (("crosscheck/trainer/", 50), ("ref_numpy/outcome.py", 20),
         ("newer loss families", 30), ("the rest", 60))
# mutmut's exit codes: 1 a test failed (killed), 0 every test passed (survived), None not run
STATUS = {0: "survived", 1: "killed", 3: "killed", 33: "no tests", 34: "skipped",
          36: "timeout", 24: "timeout", 152: "timeout", -24: "timeout", 255: "timeout",
          None: "not checked"}


def mutants(root):
    """{mutant name: exit code or None} from mutmut's .meta files under root/mutants."""
    out = {}
    for meta in glob.glob(os.path.join(root, "mutants", "**", "*.py.meta"), recursive=True):
        with open(meta, encoding="utf-8") as fh:
            out.update(json.load(fh)["exit_code_by_key"])
    return out


def stratum(name):
    module, _, function = name.rpartition(".x")
    if module.startswith("crosscheck.trainer"):
        return "crosscheck/trainer/"
    if module == "ref_numpy.outcome":
        return "ref_numpy/outcome.py"
    if module == "ref_numpy.pg_losses" or module == "ref_numpy.policy_losses" and (
            "sapo" in function or "vespo" in function or "gamma" in function):
        return "newer loss families"
    return "the rest"


def draw(names, seed):
    rng = random.Random(seed)
    by = collections.defaultdict(list)
    for n in sorted(names):
        by[stratum(n)].append(n)
    return [(s, n) for s, k in SIZES for n in rng.sample(by[s], min(k, len(by[s])))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, help="draw a sample: print its mutant names")
    p.add_argument("--report", metavar="FILE", help="tally the sample listed in FILE")
    args = p.parse_args(argv)
    if (args.seed is None) == (args.report is None):
        p.error("give --seed (draw) or --report FILE (tally)")
    found = mutants(ROOT)
    if not found:
        p.error("no mutants: run `mutmut run 'zzz_none*'` first")
    if args.seed is not None:
        sample = draw(found, args.seed)
        counts = collections.Counter(s for s, _ in sample)
        total = collections.Counter(map(stratum, found))
        print(", ".join(f"{s}: {counts[s]} of {total[s]}" for s, _ in SIZES) +
              f" ({len(found)} mutants)", file=sys.stderr)
        print("\n".join(n for _, n in sample))
        return 0
    with open(args.report, encoding="utf-8") as fh:
        names = [line.strip() for line in fh if line.strip()]
    table = collections.defaultdict(collections.Counter)
    for n in names:
        table[stratum(n)][STATUS.get(found.get(n), f"exit {found.get(n)}")] += 1
    print("| stratum | " + " | ".join(sorted({k for c in table.values() for k in c})) + " |")
    for s, _ in SIZES:
        print(f"| {s} | " + " | ".join(str(table[s][k]) for k in
                                        sorted({k for c in table.values() for k in c})) + " |")
    for n in names:
        if found.get(n) != 1:
            print(f"{STATUS.get(found.get(n), found.get(n))}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
