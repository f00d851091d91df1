"""The README and docs/ stay true: the README is a short front door, every relative link and
every file they name exists, nothing in the repository points outside it, and every example
output they print is what its command prints today (scripts/render_examples.py)."""
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import render_examples  # noqa: E402

DOCS = render_examples.DOCS


def text(path):
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


def test_the_readme_is_at_most_12_kb():
    assert len(text("README.md").encode("utf-8")) <= 12 * 1024


@pytest.mark.parametrize("path", DOCS)
def test_every_relative_link_resolves(path):
    base = os.path.dirname(os.path.join(ROOT, path))
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text(path)):
        if "://" in target:
            continue
        assert os.path.exists(os.path.join(base, target)), f"{path} links {target}"


def test_every_file_the_readme_names_exists():
    """A path the README names, in backticks or in its layout block (a name with a '/' or a file
    suffix), is a file or folder of the repository: from the root, or within the folder it is
    listed under."""
    readme = text("README.md")
    layout = readme[readme.index("## Layout"):]
    layout = layout[layout.index("```") + 3:]
    layout = layout[:layout.index("```")]
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|png|txt|cfg|toml)|[\w.-]+/[\w./-]*)`", readme))
    named |= set(re.findall(r"(?<![\w./-])([\w.-]+/|[\w-]+\.py)(?![\w/])", layout))
    assert len(named) >= 15, named
    folders = ("", "crosscheck", "ref_torch", "ref_numpy", "ref_common", "docs", "tests",
               "benchmarks", "scripts", "examples")
    for name in sorted(named):
        assert any(os.path.exists(os.path.join(ROOT, f, name.rstrip("/"))) for f in folders), \
            f"README names {name}"


def test_nothing_in_the_repository_refers_to_a_file_outside_it():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    outside = re.compile(r"SPEC\.md|\.\./shared|trainer_conventions\.md|bug_classes\.md")
    this = os.path.relpath(__file__, ROOT)
    found = []
    for path in tracked.stdout.split():
        if path == this or not path.endswith((".py", ".md", ".cfg", ".toml", ".txt", ".yml")):
            continue
        full = os.path.join(ROOT, path)
        if os.path.exists(full) and outside.search(open(full, encoding="utf-8").read()):
            found.append(path)
    assert found == []


def test_every_example_output_is_what_its_command_prints_today():
    stale = [(where, name) for where, name, _, _ in render_examples.stale()]
    assert stale == [], f"run `python scripts/render_examples.py`; stale: {stale}"


def test_every_marked_example_is_known_and_every_known_one_is_shown():
    shown = {name for path in DOCS for name in render_examples.markdown_examples(path)}
    known = set(render_examples.EXAMPLES)
    files = {n for n, ex in render_examples.EXAMPLES.items() if ex.output}
    assert shown <= known
    assert known - files <= shown, known - files - shown


ROW = "gae                               value   PASS      12     {}     8.75e-16"


@pytest.mark.parametrize("documented, printed", [
    (ROW.format("2.22e-16"), ROW.format("0.00e+00")),           # another CPU's rounding
    (ROW.format("3.40e-09"), ROW.format("5.21e-09")),           # its finite differences
    ("yours 0.2968846192, reference -1.688796498",
     "yours 0.2968846217, reference -1.688796498"),             # a float32 kernel's 8th digit
    ("33 functions: all passed (seed 0, 1.4 s)", "33 functions: all passed (seed 0, 9.7 s)"),
])
def test_an_example_differing_only_in_last_digits_or_timing_is_not_stale(documented, printed):
    assert render_examples.same(documented, printed)


@pytest.mark.parametrize("documented, printed", [
    (ROW.format("2.22e-16"), ROW.format("2.22e-16").replace("PASS", "FAIL")),   # a status
    (ROW.format("2.22e-16"), ROW.format("3.10e-07")),           # an error beyond rounding
    (ROW.format("1.70e-03"), ROW.format("2.35e-02")),           # an error grown 14×
    ("rtol 1e-06, atol 1e-08", "rtol 1e-05, atol 1e-08"),       # a tolerance is no measurement
    ("200 cases", "199 cases"),                                  # a count
    ("yours 0.2968846192", "yours 0.2968976192"),                # a value at 1e-5 relative
    ("verdict: CONFORMS", "verdict: DOES NOT CONFORM"),
    ("eps=1e-6", "eps=1e-4"),                                    # a convention
])
def test_an_example_whose_words_or_numbers_changed_is_stale(documented, printed):
    assert not render_examples.same(documented, printed)


def test_the_audit_quick_start_names_real_references_and_every_profile():
    from crosscheck.audit import profiles
    from crosscheck.check import registry
    doc = text("docs/audit.md")
    start = doc.index("## Quick start")
    assert start < doc.index("## The adapter contract")           # near the top
    quick = doc[start:doc.index("## The adapter contract")]
    refs = re.findall(r"^\| [^|]+ \| `(\w+)`", quick, re.M)
    assert {"group_advantages", "gae", "ppo_clip_loss", "policy_objective", "kl_penalty",
            "aggregate"} <= set(refs)
    assert set(refs) <= set(registry.build())
    named = re.search(r"`--profile` is one of (.*?);", quick, re.S).group(1)
    assert sorted(re.findall(r"`(\w+)`", named)) == sorted(profiles.PROFILES)
