"""crosscheck.live.watch on real ms-swift GRPOTrainer runs (one process, CPU, the tiny model of
tiny_trl.py), run in ms-swift's own environment: its pins differ from the `live` extra's.

The environment is named by CROSSCHECK_SWIFT_VENV (.ci/run builds it from
tests/live/swift-requirements.txt, with ms-swift 4.6.0 in the venv and 4.5.3 installed by
`pip install --no-deps --target VENV/ms-swift-4.5.3`). Unset, the tests skip with that reason;
set, a missing or broken environment fails them."""
import json
import os
import subprocess
import sys

import pytest

from tests.live import tiny_swift

VENV = os.environ.get("CROSSCHECK_SWIFT_VENV")
pytestmark = pytest.mark.skipif(
    not VENV, reason="CROSSCHECK_SWIFT_VENV names no ms-swift environment (.ci/run builds one "
                     "from tests/live/swift-requirements.txt)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD = "ms-swift-4.5.3"                     # the --target directory of ms-swift 4.5.3 in VENV


def runs(tmp, configs, old=False):
    """Run each configuration watched, in the ms-swift environment; return their reports."""
    python = os.path.join(VENV, "bin", "python")
    if not os.access(python, os.X_OK):
        pytest.fail(f"CROSSCHECK_SWIFT_VENV is {VENV!r} but {python} is not an executable "
                    f"python: build it as .ci/run does")
    env = dict(os.environ, PYTHONPATH=ROOT)
    if old:
        target = os.path.join(VENV, OLD)
        if not os.path.isdir(target):
            pytest.fail(f"{target} is missing: pip install --no-deps --target {target} "
                        f"ms-swift==4.5.3")
        env["PYTHONPATH"] = target + os.pathsep + ROOT
    out = subprocess.run([python, "-m", "tests.live.tiny_swift", str(tmp), json.dumps(configs)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    reports = [json.loads(line[len(tiny_swift.MARK):]) for line in out.stdout.splitlines()
               if line.startswith(tiny_swift.MARK)]
    if out.returncode != 0 or len(reports) != len(configs):
        sys.stderr.write(out.stderr[-6000:])
        pytest.fail(f"the ms-swift runs exited with {out.returncode} after {len(reports)} of "
                    f"{len(configs)} reports")
    return reports


CLEAN = [
    dict(loss_type="dapo", gradient_accumulation_steps=2),
    dict(loss_type="grpo", gradient_accumulation_steps=2, beta=0.04),
    dict(loss_type="bnpo", gradient_accumulation_steps=2),
    dict(loss_type="dr_grpo", gradient_accumulation_steps=2),
    dict(loss_type="cispo", gradient_accumulation_steps=2, epsilon_high=5.0),
]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("swift-clean"), CLEAN)


@pytest.mark.parametrize("i", range(len(CLEAN)),
                         ids=[c["loss_type"] for c in CLEAN])
def test_an_unmodified_ms_swift_4_6_run_conforms_at_every_checked_step(clean, i):
    report = clean[i]
    assert report["trainer"] == "ms-swift 4.6.0", report["text"]
    assert report["ok"] is True, report["text"]
    assert len(report["steps"]) == 2
    for s in report["steps"]:
        assert s["counts"]["gradient"]["checked"] > 0, report["text"]
        assert s["counts"]["gradient"]["failed"] == 0
        assert s["counts"]["micro-batch loss"] == {"checked": 2, "failed": 0}
        assert s["counts"]["settings"]["failed"] == 0


def test_ms_swift_4_5_3_dapo_with_two_accumulation_steps_is_reported_as_half_the_gradient(
        tmp_path):
    # ms-swift #10117: the window-normalised loss divided by the accumulation steps again
    report, = runs(tmp_path, [dict(loss_type="dapo", gradient_accumulation_steps=2)], old=True)
    assert report["trainer"] == "ms-swift 4.5.3", report["text"]
    assert report["ok"] is False
    first = report["steps"][0]
    assert first["step"] == 1
    grad = [f for f in first["findings"] if f["check"] == "gradient"]
    assert grad and all(f["grade"] == "deviation" for f in grad)
    assert "0.5× the documented objective's at every token" in grad[0]["message"], \
        report["text"]
    assert grad[0]["got"] == pytest.approx(0.5 * grad[0]["expected"], rel=1e-5)
