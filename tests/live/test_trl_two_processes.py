"""crosscheck.live.watch inside a 2-process TRL run on CPU (gloo), launched as PyTorch's own
launcher launches a user's script (python -m torch.distributed.run --nproc_per_node 2): rank 0
gathers each step's micro-batches and checks the gradient averaged over both ranks."""
import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("trl")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

from tests.live import tiny_trl  # noqa: E402

HERE = os.path.dirname(__file__)
SCENARIOS = ("dapo", "grpo-accumulated-kl", "local-count", "twice-accumulated", "wrong-mask",
             "no-sync", "count-padding", "rolled-advantages")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("trl-2p"))
    out = os.path.join(root, "reports")
    os.makedirs(out)
    tiny_trl.model_dir(root)                      # once, before the ranks start
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with socket.socket() as sock:                 # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", port,
         os.path.join(HERE, "two_processes.py"), root, out, *SCENARIOS],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, (sorted(os.listdir(out)), proc.stderr[-4000:])
    found = {}
    for name in SCENARIOS:
        for rank in (0, 1):
            with open(os.path.join(out, f"{name}.rank{rank}.json")) as f:
                found[name, rank] = json.load(f)
    return found


@pytest.mark.parametrize("name", ["dapo", "grpo-accumulated-kl"])
def test_an_unmodified_two_process_run_conforms(reports, name):
    r0, r1 = reports[name, 0], reports[name, 1]
    assert r0["world"] == 2 and r0["verdict"] == "CONFORMS", r0
    assert r1["verdict"] == r0["verdict"]           # every rank learns rank 0's verdict
    for step in r0["steps"]:
        assert step["counts"]["gradient"]["failed"] == 0
        # both ranks' micro-batches: accumulation steps × 2 ranks
        acc = 2 if name == "grpo-accumulated-kl" else 1
        assert step["counts"]["micro-batch loss"]["checked"] == 2 * acc
        assert step["counts"]["advantages"]["checked"] == 2 * 4 * acc
        # rank 1's gradient checksum against rank 0's, after the all-reduce
        assert step["counts"]["rank agreement"] == {"checked": 1, "failed": 0}
    assert not any(c.startswith("rank agreement: not applicable") for c in r0["checked"])


@pytest.mark.parametrize("name, message", [
    ("local-count", "× the documented objective's at every token"),
    ("twice-accumulated", "is 0.5× the documented objective's at every token where"),
    ("wrong-mask", "a wrong mask: the gradient reaches "),
])
def test_a_planted_bug_is_caught_at_the_first_step_on_both_ranks(reports, name, message):
    r0 = reports[name, 0]
    assert r0["verdict"] == "DEVIATES" and reports[name, 1]["verdict"] == "DEVIATES"
    first = [f for f in r0["steps"][0]["findings"] if f["grade"] == "deviation"
             and f["check"] == "gradient"]
    assert first and any(message in f["message"] for f in first)
    assert {f["rank"] for f in first} == {0, 1}


def test_gradients_never_averaged_across_processes_are_caught_naming_the_ranks(reports):
    # every micro-step under DDP's no_sync(): the loss and its ∂/∂logp are each rank's own and
    # correct, so only the ranks' disagreement after the last backward shows the bug
    r0, r1 = reports["no-sync", 0], reports["no-sync", 1]
    assert r0["verdict"] == "DEVIATES" and r1["verdict"] == "DEVIATES"
    first = r0["steps"][0]
    assert first["counts"]["rank agreement"] == {"checked": 1, "failed": 1}
    assert first["counts"]["gradient"]["failed"] == 0
    (f,) = [f for f in first["findings"] if f["check"] == "rank agreement"]
    assert f["grade"] == "deviation" and f["rank"] == 1 and f["got"] != f["expected"]
    assert "rank 0 (" in f["message"] and "rank 1 (" in f["message"]


@pytest.mark.parametrize("name, check, message", [
    ("count-padding", "global counts", "num_items_in_batch is"),
    ("rolled-advantages", "row advantages", ""),
])
def test_a_provenance_bug_is_caught_at_the_first_step_of_a_two_process_run(reports, name,
                                                                          check, message):
    r0, r1 = reports[name, 0], reports[name, 1]
    assert r0["verdict"] == "DEVIATES" and r1["verdict"] == "DEVIATES"
    first = [f for f in r0["steps"][0]["findings"] if f["check"] == check]
    assert first and all(f["grade"] == "deviation" and message in f["message"] for f in first)
