"""crosscheck.live.watch on real ms-swift GRPOTrainer runs (one process, CPU, the tiny model of
tiny_trl.py), run in ms-swift's own environment: its pins differ from the `live` extra's.

The environment is named by CROSSCHECK_SWIFT_VENV (.ci/run builds it from
tests/live/swift-requirements.txt, with ms-swift 4.6.0 in the venv and 4.5.3 installed by
`pip install --no-deps --target VENV/ms-swift-4.5.3`). Unset, the tests skip with that reason;
set, a missing or broken environment fails them."""
import json
import os
import socket
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


def _python():
    python = os.path.join(VENV, "bin", "python")
    if not os.access(python, os.X_OK):
        pytest.fail(f"CROSSCHECK_SWIFT_VENV is {VENV!r} but {python} is not an executable "
                    f"python: build it as .ci/run does")
    return python


def runs(tmp, configs, old=False):
    """Run each configuration watched, in the ms-swift environment; return their reports."""
    python = _python()
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


# each loss type and importance-sampling level, and the settings that change which tensors the
# loss receives; num_iterations 2 makes step 2 reuse step 1's generation, where the ratio, the
# clip and the FIPO weight are away from 1
CLEAN = [
    dict(loss_type="dapo", gradient_accumulation_steps=2),
    dict(loss_type="grpo", gradient_accumulation_steps=2, beta=0.04, steps_per_generation=4),
    dict(loss_type="bnpo", gradient_accumulation_steps=2),
    dict(loss_type="dr_grpo", gradient_accumulation_steps=2),
    dict(loss_type="cispo", gradient_accumulation_steps=2, epsilon_high=5.0, num_iterations=2),
    dict(loss_type="sapo", gradient_accumulation_steps=2, num_iterations=2),
    dict(loss_type="sapo", gradient_accumulation_steps=2, num_iterations=2,
         importance_sampling_level="sequence"),
    dict(loss_type="grpo", gradient_accumulation_steps=2, num_iterations=2,
         importance_sampling_level="sequence"),
    dict(loss_type="grpo", gradient_accumulation_steps=2, num_iterations=2,
         importance_sampling_level="sequence_token"),
    dict(loss_type="fipo", gradient_accumulation_steps=2, num_iterations=2,
         lift_fipo_guard=True),
    dict(loss_type="dapo", gradient_accumulation_steps=2, num_iterations=2, beta=0.04,
         epsilon_high=0.28),
    dict(loss_type="bnpo", gradient_accumulation_steps=2, overlong_filter=True,
         max_completion_length=6),
    dict(loss_type="dapo", gradient_accumulation_steps=2, dynamic_sample=True,
         reward_funcs=["crosscheck_has_a"]),
]


def _name(c):
    return "-".join(str(v) for k, v in c.items() if k not in ("gradient_accumulation_steps",
                                                              "reward_funcs"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("swift-clean"), CLEAN)


@pytest.mark.parametrize("i", range(len(CLEAN)), ids=[_name(c) for c in CLEAN])
def test_an_unmodified_ms_swift_4_6_run_conforms_at_every_checked_step(clean, i):
    report, conf = clean[i], CLEAN[i]
    assert report["trainer"] == "ms-swift 4.6.0", report["text"]
    assert report["ok"] is True, report["text"]
    assert not report["errors"], report["errors"]
    assert len(report["steps"]) == 2
    for s in report["steps"]:
        assert s["counts"]["gradient"]["checked"] > 0, report["text"]
        assert s["counts"]["gradient"]["failed"] == 0
        assert s["counts"]["micro-batch loss"] == {"checked": 2, "failed": 0}
        assert s["counts"]["settings"]["failed"] == 0
        # provenance: every micro-step's rows, every row's advantage, the global count
        assert s["counts"]["rows"] == {"checked": 8, "failed": 0}, report["text"]
        assert s["counts"]["row advantages"] == {"checked": 8, "failed": 0}
        assert s["counts"]["global counts"] == {"checked": 2, "failed": 0}
        assert s["counts"]["temperature"]["failed"] == 0
        assert s["counts"]["temperature"]["checked"] > 1      # the sampler's and one row's
    first, second = report["steps"]
    # the advantages of each generation, from its rewards (step 2 regenerates unless the
    # generation is reused: steps_per_generation or num_iterations above 1 window)
    spg = conf.get("steps_per_generation", 2)
    reused = conf.get("num_iterations", 1) > 1 or spg > 2
    assert first["counts"]["advantages"] == {"checked": 4 * spg, "failed": 0}, report["text"]
    assert ("advantages" in second["counts"]) is not reused
    # old log-probs: ratio 1 where no optimizer step separates them from the generation
    assert first["counts"]["old log-probs"]["failed"] == 0
    assert first["counts"]["old log-probs"]["checked"] > 0
    assert ("old log-probs" in second["counts"]) is not reused
    if conf.get("beta"):
        assert first["counts"]["reference log-probs"]["checked"] > 1
        assert all(s["counts"]["reference log-probs"]["failed"] == 0 for s in report["steps"])
    if conf.get("dynamic_sample"):
        dyn = [s["counts"].get("dynamic sampling") for s in report["steps"]]
        assert dyn == [{"checked": 2, "failed": 0}] * 2, report["text"]


def test_ms_swift_refuses_fipo_in_a_run_with_no_teacher(tmp_path):
    # _setup_teacher (rollout_mixin.py) sets _has_teacher when no teacher is given (dynamic
    # self-distillation) as when one is, and _compute_loss_and_metrics refuses 'fipo' whenever
    # it is set: the CLEAN fipo run lifts that guard to check ms-swift's fipo code itself
    env = dict(os.environ, PYTHONPATH=ROOT)
    conf = [dict(loss_type="fipo", gradient_accumulation_steps=2)]
    out = subprocess.run([_python(), "-m", "tests.live.tiny_swift", str(tmp_path),
                          json.dumps(conf)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode != 0
    assert "does not support loss_type='fipo'" in out.stderr, out.stderr[-3000:]


# dapo (cispo and fipo alike) where ms-swift's normaliser is not the documented token count:
# each micro-batch is divided by num_items_in_batch, the completion tokens of the whole
# generation batch before the overlong filter (_prepare_batch_inputs), and one window's
# accumulation division is undone (_undo_gradient_accumulation_scaling)
REPORTED = [
    # 4 micro-batches per generation, 2 per window: each window's gradient is its share of
    # the generation's tokens times the documented token mean, the two shares summing to 1
    dict(loss_type="dapo", gradient_accumulation_steps=2, steps_per_generation=4),
    # the truncated rows leave the loss but not the count: the kept tokens' share
    dict(loss_type="dapo", gradient_accumulation_steps=2, overlong_filter=True,
         max_completion_length=6),
]


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("swift-reported"), REPORTED)


def _factors(report):
    """Each step's gradient factor against the documented objective: one per step."""
    out = []
    for s in report["steps"]:
        grad = [f for f in s["findings"] if f["check"] == "gradient"]
        assert grad and all(f["grade"] == "deviation" for f in grad), report["text"]
        assert all("a normalisation or scaling factor" in f["message"] for f in grad)
        ratios = [f["got"] / f["expected"] for f in grad]
        assert max(ratios) == pytest.approx(min(ratios), rel=1e-4)
        assert s["counts"]["micro-batch loss"]["failed"] == 0   # the formula is ms-swift's
        assert s["counts"]["global counts"]["failed"] == 0      # and so is its count
        out.append(ratios[0])
    return out


def test_dapo_with_more_generation_steps_than_accumulation_steps_is_reported_per_window(
        reported):
    report = reported[0]
    assert report["ok"] is False
    factors = _factors(report)
    assert 0 < min(factors) and max(factors) < 1
    assert sum(factors) == pytest.approx(1.0, rel=1e-4)


def test_dapo_with_the_overlong_filter_is_reported_as_the_kept_tokens_share(reported):
    report = reported[1]
    assert report["ok"] is False
    assert all(0 < f < 1 for f in _factors(report))


# a bug planted in ms-swift's loss (tests/live/tiny_swift.py PLANTS), and the configuration
# where it shows: (plant, configuration, check, words of the finding)
PLANTED = [
    ("doubled-beta", dict(loss_type="grpo", gradient_accumulation_steps=2, beta=0.04,
                          num_iterations=2), "gradient",
     "the KL term: β·KL's gradient is 2× the reference's"),
    ("no-clip-higher", dict(loss_type="dapo", gradient_accumulation_steps=2,
                            epsilon_high=0.28, num_iterations=2), "gradient",
     "the clip bounds (ε_low, ε_high): "),
    ("dropped-mask", dict(loss_type="dapo", gradient_accumulation_steps=2), "gradient",
     "a wrong mask: the gradient reaches"),
    ("micro-batch-count", dict(loss_type="dapo", gradient_accumulation_steps=2), "gradient",
     "a normalisation or scaling factor: "),
    # clip bounds no ratio of the run reaches, so the ratio alone tells the two apart
    ("old-is-current", dict(loss_type="grpo", gradient_accumulation_steps=2,
                            num_iterations=2, epsilon=0.9, epsilon_high=5.0), "gradient",
     "the importance weight: the policy term's gradient lacks"),
    ("no-resample", dict(loss_type="dapo", gradient_accumulation_steps=2, dynamic_sample=True,
                         reward_funcs=["crosscheck_has_a"]), "dynamic sampling",
     "have reward spread 0"),
]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("swift-planted"),
                [dict(conf, plant=plant) for plant, conf, _, _ in PLANTED])


@pytest.mark.parametrize("i", range(len(PLANTED)), ids=[p[0] for p in PLANTED])
def test_a_bug_planted_in_ms_swift_s_loss_is_caught_naming_its_cause(planted, i):
    plant, conf, check, words = PLANTED[i]
    report = planted[i]
    assert report["ok"] is False, report["text"]
    found = [f for s in report["steps"] for f in s["findings"]
             if f["check"] == check and f["grade"] == "deviation"]
    assert found and any(words in f["message"] for f in found), report["text"]


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


# two processes on CPU (gloo), launched as PyTorch's launcher launches a user's script; each
# scenario of tests/live/swift_two_processes.py writes each rank's report
TWO = ("dapo", "grpo-kl", "no-sync", "micro-batch-count")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    python = _python()
    root = str(tmp_path_factory.mktemp("swift-2p"))
    out = os.path.join(root, "reports")
    os.makedirs(out)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    with socket.socket() as sock:                 # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    proc = subprocess.run(
        [python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
         "127.0.0.1", "--master_port", port,
         os.path.join(ROOT, "tests", "live", "swift_two_processes.py"), root, out, *TWO],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        pytest.fail(f"the 2-process ms-swift runs exited with {proc.returncode}; reports: "
                    f"{sorted(os.listdir(out))}")
    found = {}
    for name in TWO:
        for rank in (0, 1):
            with open(os.path.join(out, f"{name}.rank{rank}.json")) as f:
                found[name, rank] = json.load(f)
    return found


@pytest.mark.parametrize("name", ["dapo", "grpo-kl"])
def test_an_unmodified_two_process_ms_swift_run_conforms_with_its_ranks_agreeing(two, name):
    r0, r1 = two[name, 0], two[name, 1]
    assert r0["world"] == 2 and r0["verdict"] == "CONFORMS", r0["steps"]
    assert r1["verdict"] == "CONFORMS"              # every rank learns rank 0's verdict
    for step in r0["steps"]:
        assert step["counts"]["gradient"]["failed"] == 0
        # both ranks' micro-batches: 2 accumulation steps × 2 ranks
        assert step["counts"]["micro-batch loss"] == {"checked": 4, "failed": 0}
        assert step["counts"]["rank agreement"] == {"checked": 1, "failed": 0}
        assert step["counts"]["rows"] == {"checked": 16, "failed": 0}
        assert step["counts"]["global counts"] == {"checked": 4, "failed": 0}
    # each rank's 8 rows of the first generation, from the 16 rewards of both
    assert r0["steps"][0]["counts"]["advantages"] == {"checked": 16, "failed": 0}


def test_two_ms_swift_processes_never_averaging_gradients_are_caught_naming_the_ranks(two):
    # every micro-step under DDP's no_sync(): each rank's loss and ∂loss/∂logp are its own and
    # correct, so only the ranks' disagreement after the last backward shows the bug
    r0, r1 = two["no-sync", 0], two["no-sync", 1]
    assert r0["verdict"] == "DEVIATES" and r1["verdict"] == "DEVIATES"
    first = r0["steps"][0]
    assert first["counts"]["rank agreement"] == {"checked": 1, "failed": 1}
    assert first["counts"]["gradient"]["failed"] == 0
    (f,) = [f for f in first["findings"] if f["check"] == "rank agreement"]
    assert f["grade"] == "deviation" and f["rank"] == 1 and f["got"] != f["expected"]


def test_a_per_micro_batch_count_on_two_ms_swift_processes_is_caught_on_both_ranks(two):
    r0 = two["micro-batch-count", 0]
    assert r0["verdict"] == "DEVIATES" and two["micro-batch-count", 1]["verdict"] == "DEVIATES"
    grad = [f for f in r0["steps"][0]["findings"] if f["check"] == "gradient"
            and f["grade"] == "deviation"]
    assert {f["rank"] for f in grad} == {0, 1}
