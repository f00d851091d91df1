"""Run the report cards over many releases of each trainer: the version sweep.

Each release is installed with `pip install --no-deps --target DIR/<trainer>/<version>` (its
own dependencies would replace torch) and its card is run in a fresh interpreter with that
directory first on PYTHONPATH, so that `import <trainer>` finds the release under test.

    python scripts/sweep.py --dir ~/sweep --install          # install the releases, then run
    python scripts/sweep.py --dir ~/sweep --only trl --versions 1.16.0,0.29.1
    python scripts/sweep.py --dir ~/sweep --jobs 2 --json sweep.json

Prints a Markdown table: per release, the exit status, the card verdict, the coverage, the rows
by verdict, the findings by grade, and whether anything printed a traceback.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

# the releases swept: verl 0.4.0 to 0.9.1, TRL 0.19 to 1.16.0 (each minor's last patch),
# OpenRLHF 0.8.5 to 0.11.2, SkyRL 0.1.0 to 0.4.0, ms-swift 4.4.0 to 4.6.0, ART (openpipe-art)
# every release with art/loss.py (0.5.4 on; before, the loss was inline in
# art/unsloth/train.py), Tunix (google-tunix) 0.1.0 to 0.1.7, run by a Python that has jax
RELEASES = {
    "verl": "0.4.0 0.4.1 0.5.0 0.6.0 0.6.1 0.7.0 0.7.1 0.8.0 0.9.0 0.9.1",
    "trl": "0.19.1 0.20.0 0.21.0 0.22.2 0.23.1 0.24.0 0.25.1 0.26.2 0.27.2 0.28.0 0.29.1 1.0.0 "
           "1.1.0 1.2.0 1.3.0 1.4.0 1.5.1 1.6.0 1.7.1 1.8.0 1.9.2 1.10.0 1.11.0 1.12.0 1.13.0 "
           "1.14.2 1.15.0 1.16.0",
    "openrlhf": "0.8.5 0.8.6 0.8.7 0.8.8 0.8.9 0.8.9.post1 0.8.10 0.8.11 0.9.0 0.9.1 "
                "0.9.1.post1 0.9.2 0.9.3 0.9.4 0.9.5 0.9.6 0.9.7 0.9.8 0.9.9 0.9.10 0.10.0 "
                "0.10.1 0.10.1.post1 0.10.1.post2 0.10.2 0.10.3 0.10.4 0.11.0 0.11.1 0.11.2",
    "skyrl": "0.1.0 0.2.0 0.3.0 0.4.0",
    "ms-swift": "4.4.0 4.4.1 4.4.2 4.5.0 4.5.1 4.5.2 4.5.3 4.6.0",
    "art": "0.5.4 0.5.5 0.5.6 0.5.7 0.5.9 0.5.10 0.5.11 0.5.16 0.5.17 0.5.18",
    "tunix": "0.1.0 0.1.1 0.1.2 0.1.3 0.1.4 0.1.5 0.1.6 0.1.7",     # where jax is installed
}
TIMEOUT = 600


def _declared(name):
    """(the import name, the distribution) of a trainer's card: ms-swift installs `swift`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:                  # this checkout's crosscheck, as `-m` runs it
        sys.path.insert(0, root)
    from crosscheck import trainer as trainers
    t = trainers.get(name)
    return t.package, t.dist


def install(target, name, version):
    package, dist = _declared(name)
    if os.path.isdir(os.path.join(target, package)):
        return None
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                          "--ignore-requires-python",      # SkyRL 0.4 declares Python >= 3.12
                          "--quiet", "--target", target, f"{dist}=={version}"],
                         capture_output=True, text=True)
    return None if out.returncode == 0 else out.stderr.strip().splitlines()[-1:]


def card(target, name, version):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [target] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        out = subprocess.run([sys.executable, "-m", "crosscheck", "trainer", name, "--json"],
                             capture_output=True, text=True, env=env, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return dict(trainer=name, version=version, exit="timeout")
    row = dict(trainer=name, version=version, exit=out.returncode,
               traceback="Traceback (most recent call last)" in out.stderr + out.stdout)
    try:
        data = json.loads(out.stdout)
    except ValueError:
        row["error"] = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return row
    verdicts = {}
    for r in data["rows"]:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
    row.update(verdict=data["verdict"], coverage=data["coverage"]["ratio"], rows=verdicts,
               grades=data["grades"], loaded_from=data["root"],
               new=[f"{r['function']} [{r['label']}] {f['check']}: {f['message'][:120]}"
                    for r in data["rows"] for f in r["findings"]
                    if f["grade"] == "deviation" and not f["known"]])
    return row


def table(results):
    lines = ["| trainer | version | exit | verdict | coverage | rows | findings | traceback |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "verdict" not in r:
            lines.append(f"| {r['trainer']} | {r['version']} | {r['exit']} | "
                         f"{r.get('error', '')} | – | – | – | "
                         f"{'yes' if r.get('traceback') else 'no'} |")
            continue
        rows = ", ".join(f"{n} {v.lower()}" for v, n in sorted(r["rows"].items()))
        grades = ", ".join(f"{n} {g}" for g, n in r["grades"].items() if n)
        lines.append(f"| {r['trainer']} | {r['version']} | {r['exit']} | {r['verdict']} | "
                     f"{100 * r['coverage']:.0f} % | {rows} | {grades or 'none'} | "
                     f"{'yes' if r['traceback'] else 'no'} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where releases are (or get) installed")
    ap.add_argument("--install", action="store_true", help="install missing releases first")
    ap.add_argument("--only", choices=sorted(RELEASES), action="append")
    ap.add_argument("--versions", help="comma-separated releases to run (default: all)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", help="write the full results here")
    args = ap.parse_args(argv)
    wanted = set(args.versions.split(",")) if args.versions else None
    todo = [(n, v) for n in (args.only or RELEASES) for v in RELEASES[n].split()
            if wanted is None or v in wanted]
    results = []
    runnable = []
    for name, version in todo:
        target = os.path.join(os.path.abspath(os.path.expanduser(args.dir)), name, version)
        failed = install(target, name, version) if args.install else None
        if failed or not os.path.isdir(os.path.join(target, _declared(name)[0])):
            results.append(dict(trainer=name, version=version, exit="not installed",
                                error="; ".join(failed or ["run with --install"])))
            continue
        runnable.append((target, name, version))
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for i, row in enumerate(pool.map(lambda a: card(*a), runnable)):
            if sys.stderr.isatty():
                sys.stderr.write(f"\r\033[K[{i + 1}/{len(runnable)}] {row['trainer']} "
                                 f"{row['version']}")
            results.append(row)
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    order = {(n, v): i for i, (n, v) in enumerate(todo)}
    results.sort(key=lambda r: order[(r["trainer"], r["version"])])
    print(table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
