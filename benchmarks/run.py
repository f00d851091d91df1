"""Benchmarks: GAE implementations side by side, start-up latency, and the cross-check's cost.

    python benchmarks/run.py                 # CPU, everything (about 6 minutes here)
    python benchmarks/run.py --quick         # smaller sizes only
    python benchmarks/run.py --device cuda   # the torch rows on a GPU
    python benchmarks/run.py --live          # the live audit's cost on real TRL steps (and
                                             # MiniMind's, with CROSSCHECK_MINIMIND set)
    python benchmarks/run.py --loop          # record_loop's cost on MiniMind's train_grpo.py

Every figure is a median over rounds; every comparison is a ratio of times taken in the same
rounds: the callables of one comparison are each called once per round, in an order shuffled
every round, so that neither a slow spell of a shared machine nor a position (straight after a
cache-thrashing loop) favours one of them. A control pair, the same call timed twice per round,
gives the noise floor of those ratios: it is printed beside every speed-up, and a warning is
printed when it is off by more than 1.2×. The load average is printed before and after.
GAE is compared with the verl-style per-step torch loop (written here from the GAE recursion,
as verl, TRL and OpenRLHF write it); the bandwidth bound is (bytes read + written) ÷ the
bandwidth of a 32 MiB copy timed in the same rounds; "peak extra memory" is the peak resident
(or CUDA) memory a call adds, over the bytes of its inputs. Errors are against ref_numpy's
float64 recursion. No timing is asserted anywhere: this prints, the reader judges.
"""
import argparse
import collections
import contextlib
import io
import cProfile
import os
import pstats
import random
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from scipy.signal import lfilter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ref_numpy  # noqa: E402
import ref_torch  # noqa: E402

GAMMA, LAM = 0.99, 0.95


def verl_loop(r, v, m, gamma=GAMMA, lam=LAM):
    """The per-step baseline: one Python iteration per time step, carry across masked steps."""
    B, T = r.shape
    mf = m.to(r.dtype)
    nextvalues = torch.zeros(B, dtype=r.dtype, device=r.device)
    lastgaelam = torch.zeros(B, dtype=r.dtype, device=r.device)
    out = []
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = v[:, t] * mf[:, t] + (1 - mf[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mf[:, t] + (1 - mf[:, t]) * lastgaelam
        out.append(lastgaelam)
    adv = torch.stack(out[::-1], dim=1)
    return adv * mf, (adv + v) * mf


def lfilter_gae(r, v, lengths, gamma=GAMMA, lam=LAM):
    """scipy.signal.lfilter on reversed TD errors (right-padded rows only)."""
    B, T = r.shape
    v_next = np.concatenate([v[:, 1:], np.zeros((B, 1))], axis=1)
    valid = np.arange(T)[None] < lengths[:, None]
    delta = np.where(valid, r + gamma * np.where(np.arange(T)[None] < (lengths - 1)[:, None],
                                                  v_next, 0.0) - v, 0.0)
    adv = lfilter([1.0], [1.0, -gamma * lam], delta[:, ::-1], axis=1)[:, ::-1]
    return np.where(valid, adv, 0.0), np.where(valid, adv + v, 0.0)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(f, repeats, device="cpu"):
    return interleaved_medians([f], [repeats], device)[0]


CONTROL_LIMIT = 1.2      # a control pair off by more than this: the ratios are noise


def interleaved_medians(fs, repeats, device="cpu", seed=0):
    """The median time of each callable of fs, timed in rounds: one call of each per round
    (fs[i] in its first repeats[i] rounds), in an order shuffled every round, after one untimed
    warm-up call each. On a shared, noisy host a slow spell then slows every callable alike,
    and no callable always runs straight after the same other one."""
    order = random.Random(seed)
    for f in fs:
        f()
    sync(device)
    times = [[] for _ in fs]
    for k in range(max(repeats)):
        turn = [i for i in range(len(fs)) if k < repeats[i]]
        order.shuffle(turn)
        for i in turn:
            t0 = time.perf_counter()
            fs[i]()
            sync(device)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def control_ratio(t_a, t_b):
    """The control pair's ratio (≥ 1) and whether it is within CONTROL_LIMIT."""
    r = max(t_a, t_b) / min(t_a, t_b)
    return r, r <= CONTROL_LIMIT


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg()) + f" ({os.cpu_count()} cores)"
    except OSError:
        return "unavailable"


COPY_BYTES = 32 * 2 ** 20


def copy_timer(device):
    """A callable that copies 32 MiB of float32: COPY_BYTES read and COPY_BYTES written."""
    x = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    return lambda: y.copy_(x)


def peak_extra_bytes(B, T, dtype, mask, impl, device):
    """Peak memory one call adds beyond its inputs. CPU: ru_maxrss of a freshly spawned Python
    (a fork of a process whose OpenMP threads are running can deadlock); CUDA: the allocator."""
    if device == "cuda":
        r, v, m = _inputs(B, T, dtype, mask, device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        IMPLS[impl](r, v, m)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-mem", str(B),
                          str(T), str(dtype).replace("torch.", ""), mask, impl],
                         capture_output=True, text=True, timeout=300)
    return int(out.stdout.strip().splitlines()[-1])


def _inputs(B, T, dtype, mask, device="cpu"):
    rng = np.random.default_rng(0)
    r = torch.tensor(rng.normal(size=(B, T)), dtype=dtype, device=device)
    v = torch.tensor(rng.normal(size=(B, T)), dtype=dtype, device=device)
    lengths = rng.integers(T // 2, T + 1, size=B)
    m = np.arange(T)[None] < lengths[:, None]
    if mask == "holed":
        m &= rng.random((B, T)) < 0.8
    return r, v, torch.tensor(m, device=device)


IMPLS = {"per-step loop": lambda r, v, m: verl_loop(r, v, m),
         "ref_torch.gae": lambda r, v, m: ref_torch.gae(r, v, m, gamma=GAMMA, lam=LAM)}


def _status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _child_mem(B, T, dtype, mask, impl):
    """Peak resident growth during one call: reset the high-water mark after the inputs exist
    (Linux: '5' into /proc/self/clear_refs), then read VmHWM − VmRSS."""
    inputs = _inputs(B, T, getattr(torch, dtype), mask)
    IMPLS[impl](*inputs)                       # warm-up: lazy initialisation is not the call's
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    IMPLS[impl](*inputs)
    print((_status_kb("VmHWM") - before) * 1024)


def gae_table(sizes, device, repeats):
    """One row per implementation, size, dtype and mask. The implementations of one row group,
    a 32 MiB copy and the control pair (ref_torch.gae twice) are timed in the same shuffled
    rounds (interleaved_medians): the speed-ups and the bandwidth bound are ratios of times
    taken in the same seconds, and the control pair's ratio is their noise floor. The
    fresh-output bound is the time to allocate and write both outputs, timed in the same
    rounds. Returns the rows: (..., error, control ratio, × fresh-output bound)."""
    copy = copy_timer(device)
    head = ("| B | T | dtype | mask | impl | median | speed-up vs loop | × copy bound | "
            "× fresh-output bound | peak extra mem / input | max rel err | control pair |")
    print()
    print(head)
    print("|---" * 12 + "|")
    rows, bandwidths, warnings = [], [], []
    rng = np.random.default_rng(0)
    for B, T in sizes:
        r64, v64 = rng.normal(size=(B, T)), rng.normal(size=(B, T))
        lengths = rng.integers(T // 2, T + 1, size=B)
        right = np.arange(T)[None] < lengths[:, None]
        holed = right & (rng.random((B, T)) < 0.8)
        for mask_name, m in (("right", right), ("holed", holed)):
            ref_adv, _ = ref_numpy.gae(r64, v64, m, gamma=GAMMA, lam=LAM)
            scale = max(np.abs(ref_adv).max(), 1e-300)
            for dtype in (torch.float32, torch.float64):
                es = torch.finfo(dtype).bits // 8
                rt = torch.tensor(r64, dtype=dtype, device=device)
                vt = torch.tensor(v64, dtype=dtype, device=device)
                mt = torch.tensor(m, device=device)
                ours = lambda: ref_torch.gae(rt, vt, mt, gamma=GAMMA, lam=LAM)  # noqa: E731
                impls = [("per-step loop", lambda: verl_loop(rt, vt, mt)),
                         ("ref_torch.gae", ours)]
                if dtype == torch.float64 and device == "cpu":
                    impls.append(("ref_numpy.gae",
                                  lambda: ref_numpy.gae(r64, v64, m, gamma=GAMMA, lam=LAM)))
                    if mask_name == "right":
                        impls.append(("scipy lfilter", lambda: lfilter_gae(r64, v64, lengths)))
                reps = [max(1, repeats if (T * B < 2e6 or name != "per-step loop") else 3)
                        for name, _ in impls]
                control = [lambda: ours(), lambda: ours()]
                # allocate and write both outputs: what any implementation must at least do
                fresh = lambda: (torch.empty_like(rt).fill_(0.0),  # noqa: E731
                                 torch.empty_like(rt).fill_(0.0))
                *times, t_copy, t_fresh, t_a, t_b = interleaved_medians(
                    [f for _, f in impls] + [copy, fresh] + control, reps + [max(reps)] * 4,
                    device, seed=B * T)
                ctrl, ok = control_ratio(t_a, t_b)
                if not ok:
                    warnings.append(f"B={B} T={T} {dtype} {mask_name}: control pair off by "
                                    f"{ctrl:.2f}×")
                bw = 2 * COPY_BYTES / t_copy
                bandwidths.append(bw)
                bound = (4 * es + 1) * B * T / bw          # r, v, mask in; adv, returns out
                base = times[0]
                for (name, f), t in zip(impls, times):
                    out = f()[0]
                    out = out.detach().cpu().double().numpy() if torch.is_tensor(out) else out
                    err = float(np.abs(out - ref_adv).max() / scale)
                    mem = ""
                    if name in IMPLS and (B * T >= 1e6 or device == "cuda"):
                        extra = peak_extra_bytes(B, T, dtype, mask_name, name, device)
                        mem = f"{extra / ((2 * es + 1) * B * T):.2f}"
                    row = (B, T, str(dtype).replace("torch.", ""), mask_name, name, t, base / t,
                           t / bound, mem, err, ctrl, t / t_fresh)
                    rows.append(row)
                    print(f"| {B} | {T} | {row[2]} | {mask_name} | {name} | {t * 1e3:.2f} ms | "
                          f"{base / t:.1f}× | {t / bound:.1f} | {t / t_fresh:.1f} | "
                          f"{mem or '-'} | {err:.1e} | {ctrl:.2f}×{'' if ok else ' (!)'} |",
                          flush=True)
    print(f"\ncopy bandwidth ({device}; 32 MiB, read + write, timed in the same rounds): "
          f"{min(bandwidths) / 1e9:.1f}–{max(bandwidths) / 1e9:.1f} GB/s, median "
          f"{statistics.median(bandwidths) / 1e9:.1f}")
    for w in warnings:
        print(f"WARNING: {w}: that row group's ratios are within noise of {CONTROL_LIMIT}×")
    return rows


def reference_calls(run) -> collections.Counter:
    """Calls into ref_numpy made from outside it while `run()` runs, by function, counted by a
    profiler (values, hand VJPs and ref_numpy.many's batched evaluations alike; a reference's
    calls to other references are part of its one evaluation)."""
    import ref_numpy.many
    pkg = os.path.dirname(ref_numpy.__file__)
    public = {(f.__code__.co_filename, f.__code__.co_firstlineno, f.__name__)
              for f in [getattr(ref_numpy, n) for n in ref_numpy.__all__] +
              [ref_numpy.many.evaluate, ref_numpy.many.vjps]}
    prof = cProfile.Profile()
    prof.enable()
    try:
        run()
    finally:
        prof.disable()
    counts = collections.Counter()
    for func, (_, _, _, _, callers) in pstats.Stats(prof).stats.items():
        if func in public:
            for caller, c in callers.items():
                if not caller[0].startswith(pkg):
                    counts[func[2]] += c[1] if isinstance(c, tuple) else c
    return counts


def harness_table(repeats):
    """Cases per second per stage, and the reference evaluations of the default run."""
    from crosscheck.check import registry, stages

    entries = registry.build()
    print()
    print("| stage | cases/s (all functions, 12 cases each) |")
    print("|---|---|")
    for stage in stages.STAGES:
        t0 = time.perf_counter()
        n = sum(r.cases for r in stages.run(entries, seed=0, n_cases=12, stages=(stage,)))
        dt = time.perf_counter() - t0
        print(f"| {stage} | {n / dt:.0f} ({n} cases in {dt:.2f} s) |")
    counts = reference_calls(lambda: stages.run(entries, seed=0, n_cases=12))
    top = ", ".join(f"{name} {n}" for name, n in counts.most_common(6))
    print(f"\nreference evaluations in the default run (profiler): {sum(counts.values())} "
          f"(target ≤ 3200; most: {top})")


def _command_time(argv):
    t0 = time.perf_counter()
    subprocess.run([sys.executable] + argv, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=ROOT, check=False)
    return time.perf_counter() - t0


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
STARTUP = [["-m", "crosscheck", "--help"], ["-m", "crosscheck", "audit", "--help"],
           ["-m", "crosscheck", "explain", "--help"], ["-m", "crosscheck", "trainer", "--help"],
           ["-m", "crosscheck", "--version"]]
IMPORT_BASELINE = ["-c", "import torch, scipy.differentiate"]


PACKAGES = ("crosscheck", "ref_numpy", "ref_torch", "ref_common")


def compile_project() -> str:
    """Byte-compile the project once, as pip does when it installs a package, so that both
    sides of the comparison load cached bytecode (torch and scipy have theirs from their
    install). Where PYTHONDONTWRITEBYTECODE is set, Python would otherwise compile the
    project's modules anew in every run. Returns what was done, for the printout."""
    import compileall
    ok = all(compileall.compile_dir(os.path.join(ROOT, p), quiet=1, force=False)
             for p in PACKAGES)
    flag = " (PYTHONDONTWRITEBYTECODE is set here)" if sys.dont_write_bytecode else ""
    return f"project bytecode compiled once, as an installed package has it{flag}: " + \
        ("ok" if ok else "failed")


def _timed_rounds(cmds, repeats, seed, what):
    """Each (label, argv) of `cmds` in a fresh interpreter, once per round in a shuffled order;
    prints the medians and every round. Returns (medians, rounds) in the order of `cmds`."""
    rounds = [[] for _ in cmds]
    order = random.Random(seed)
    for _ in range(repeats):
        turn = list(range(len(cmds)))
        order.shuffle(turn)
        for i in turn:
            rounds[i].append(_command_time(cmds[i][1]))
    med = [statistics.median(r) for r in rounds]
    print()
    print(f"| {what} (fresh interpreter) | median | all rounds |")
    print("|---|---|---|")
    for (label, _), m, r in zip(cmds, med, rounds):
        print(f"| `{label}` | {m:.2f} s | {', '.join(f'{t:.2f}' for t in r)} |")
    return med, rounds


def command_table(repeats, scale=True):
    """Start-up latencies, and the default run beside `import torch, scipy.differentiate`,
    each a fresh interpreter, all timed in the same shuffled rounds with a control pair (the
    import twice)."""
    print()
    print(compile_project())
    cmds = [(" ".join(["python"] + c), c) for c in STARTUP]
    cmds += [("python -m crosscheck -q", ["-m", "crosscheck", "-q"]),
             ("python -c 'import torch, scipy.differentiate'", IMPORT_BASELINE),
             ("(control) the same import again", IMPORT_BASELINE)]
    if scale:
        cmds.append(("python -m crosscheck -q --scale 1000000",
                     ["-m", "crosscheck", "-q", "--scale", "1000000"]))
    med, rounds = _timed_rounds(cmds, repeats, 1, "command")
    default, base, again = med[len(STARTUP)], med[len(STARTUP) + 1], med[len(STARTUP) + 2]
    ctrl, ok = control_ratio(base, again)
    print(f"\nthe default run ÷ the import: {default / base:.2f}× (target ≤ 1.6×); control pair "
          f"{ctrl:.2f}×" + ("" if ok else f" — WARNING: beyond {CONTROL_LIMIT}×, the ratio is "
                                            f"within noise"))
    print(f"slowest start-up: {max(med[:len(STARTUP)]):.2f} s (target < 0.3 s)")
    if scale:
        print(f"--scale 1000000: slowest round {max(rounds[-1]):.1f} s (target < 10 s)")
    return dict(zip([label for label, _ in cmds], med))


def card_table(repeats):
    """Wall time of each installed trainer's card (a fresh interpreter, `--json`), in shuffled
    rounds beside the import control pair; the target is ≤ 10 s a card."""
    from crosscheck import trainer as trainers
    names = trainers.installed()
    cmds = [(f"python -m crosscheck trainer {n} --json", ["-m", "crosscheck", "trainer", n,
                                                           "--json"]) for n in names]
    cmds += [("python -c 'import torch, scipy.differentiate'", IMPORT_BASELINE),
             ("(control) the same import again", IMPORT_BASELINE)]
    med, _ = _timed_rounds(cmds, repeats, 2, "card")
    ctrl, ok = control_ratio(med[-2], med[-1])
    print(f"\nslowest card: {max(med[:-2], default=0):.1f} s (target ≤ 10 s); control pair "
          f"{ctrl:.2f}×" + ("" if ok else " — WARNING: the machine is noisy"))


def live_table(repeats, steps=10, B=64, T=512):
    """The live audit's cost on real TRL GRPOTrainer steps (tests/live/tiny_trl.py's model, a
    generation batch of B completions of exactly T tokens): unwatched, watched with every=1 and
    every=10, and the unwatched run again as the control pair. Each round trains a fresh
    trainer for `steps` optimizer steps per variant, in shuffled order; the figure is the
    median time per step, and the audit's own time (Report.seconds) per step beside it."""
    import importlib.util
    import tempfile
    if any(importlib.util.find_spec(n) is None for n in ("trl", "transformers", "datasets")):
        print("\nlive audit: trl, transformers or datasets not installed (pip install -e '.[live]')")
        return
    from transformers import GenerationConfig
    import crosscheck.live as live
    from tests.live import tiny_trl
    root = tempfile.mkdtemp()
    path = tiny_trl.model_dir(root)
    gc = GenerationConfig.from_pretrained(path)
    gc.eos_token_id = [tiny_trl.VOCAB["<eos>"]]
    gc.save_pretrained(path)
    own = collections.defaultdict(list)

    def variant(every):
        def run():
            tr = tiny_trl.trainer(root, per_device_train_batch_size=B, num_generations=8,
                                  max_completion_length=T, max_steps=steps, logging_steps=10 ** 6,
                                  generation_kwargs={"min_new_tokens": T})
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):    # the trainer's own log lines
                if every is None:
                    tr.train()
                else:
                    with live.watch(tr, every=every, verbose=False) as w:
                        tr.train()
                    own[every].append(w.report.seconds / steps)
            return (time.perf_counter() - t0) / steps
        return run

    labels = ["unwatched", "watch(every=1)", "watch(every=10)", "(control) unwatched again"]
    fs = [variant(None), variant(1), variant(10), variant(None)]
    per_step = collections.defaultdict(list)
    rng = random.Random(3)
    for _ in range(repeats):
        order = list(range(len(fs)))
        rng.shuffle(order)
        for k in order:
            per_step[k].append(fs[k]())
    med = [statistics.median(per_step[k]) for k in range(len(fs))]
    print(f"\nlive audit on TRL GRPOTrainer, {B} × {T} tokens a step, {steps} steps a run, "
          f"{repeats} rounds")
    print(f"{'variant':<28}{'s / step':>10}{'ratio':>9}{'own s / step':>14}")
    for k, label in enumerate(labels):
        every = {1: 1, 2: 10}.get(k)
        mine = f"{statistics.median(own[every]):.4f}" if every else ""
        print(f"{label:<28}{med[k]:>10.3f}{med[k] / med[0]:>8.3f}×{mine:>14}")
    ctrl, ok = control_ratio(med[0], med[3])
    print(f"control pair {ctrl:.2f}×" + ("" if ok else " — WARNING: the machine is noisy")
          + f"; every=1 costs {100 * statistics.median(own[1]) / med[0]:.2f} % of a step in "
            f"the audit's own code (target ≤ 10 %)")


def loop_table(repeats, steps=2, G=8, T=64, hidden=64, layers=2):
    """record_loop's cost on MiniMind's own trainer/train_grpo.py (tests/live/minimind_real.py,
    from the checkout named by CROSSCHECK_MINIMIND): 2 prompts × G completions of T tokens (an
    untrained model: no completion ends early) a batch, 2 batches an optimizer step, `steps`
    steps a run, a MiniMindConfig of `hidden` × `layers`, on one thread. Variants: the bare
    script, the script with the recorder's lines under every=1, the bare script again as the
    control pair, in shuffled rounds; the figure is the median time per step of
    grpo_train_epoch (the set-up left out), and the recorder's own time (Report.seconds: its
    hooks in the backward and its checks) per step beside it."""
    import importlib.util
    import tempfile
    checkout = os.environ.get("CROSSCHECK_MINIMIND", "")
    if not os.path.isfile(os.path.join(checkout, "trainer", "train_grpo.py")):
        print("\nrecord_loop: set CROSSCHECK_MINIMIND to a jingyaogong/minimind checkout at "
              "d65ef2c to time it on MiniMind's train_grpo.py")
        return
    if any(importlib.util.find_spec(n) is None for n in ("transformers", "datasets")):
        print("\nrecord_loop: transformers or datasets not installed (pip install -e '.[live]')")
        return
    import crosscheck.live as live
    from tests.live import minimind_real
    cispo = dict(loss="cispo", clip_high=5.0, bound="absolute", beta=0.1, kl_kind="k3",
                 agg="seq-mean-token-mean", empty_rows="include")
    groups = dict(estimator="group_advantages", group_size=G, ddof=0, eps=1e-4)
    own = collections.defaultdict(list)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # 2 threads on a shared 2-core machine thrash: 10-20× slower

    def variant(every):
        def run():
            rec = None if every is None else live.record_loop(cispo, advantages=groups,
                                                              every=every, verbose=False)
            times = []
            with contextlib.redirect_stdout(io.StringIO()), tempfile.TemporaryDirectory() as d:
                with rec or contextlib.nullcontext():
                    minimind_real.run_grpo(checkout, d, rec, steps=steps, num_generations=G,
                                           max_gen_len=T, sft_steps=0, timings=times,
                                           hidden_size=hidden, num_hidden_layers=layers)
            if rec is not None:
                if rec.report.ok is not True:
                    raise RuntimeError(f"record_loop did not conform:\n{rec.report.text()}")
                own[every].append(rec.report.seconds / steps)
            return times[0] / steps
        return run

    labels = ["bare script", "record_loop(every=1)", "(control) bare again"]
    fs = [variant(None), variant(1), variant(None)]
    per_step = collections.defaultdict(list)
    rng = random.Random(4)
    try:
        for _ in range(repeats):
            order = list(range(len(fs)))
            rng.shuffle(order)
            for k in order:
                per_step[k].append(fs[k]())
    finally:
        torch.set_num_threads(threads)
    med = [statistics.median(per_step[k]) for k in range(len(fs))]
    print(f"\nrecord_loop on MiniMind's train_grpo.py, 2 × {G} completions × {T} tokens a batch, "
          f"2 batches a step, {steps} steps a run, hidden {hidden} × {layers} layers, 1 thread, "
          f"{repeats} rounds")
    print(f"{'variant':<28}{'s / step':>10}{'ratio':>9}{'own s / step':>14}")
    for k, label in enumerate(labels):
        mine = f"{statistics.median(own[1]):.4f}" if k == 1 else ""
        print(f"{label:<28}{med[k]:>10.3f}{med[k] / med[0]:>8.3f}×{mine:>14}")
    ctrl, ok = control_ratio(med[0], med[2])
    print(f"control pair {ctrl:.2f}×" + ("" if ok else " — WARNING: the machine is noisy")
          + f"; every=1 costs {100 * statistics.median(own[1]) / med[0]:.2f} % of a step in "
            f"the recorder's own code, {100 * (med[1] / med[0] - 1):+.1f} % end to end "
            f"(target ≤ 10 %)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--quick", action="store_true", help="only B=64, T=1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-harness", action="store_true")
    p.add_argument("--cards", action="store_true", help="only the report cards' wall times")
    p.add_argument("--live", action="store_true",
                   help="only the live audit's overhead on real TRL steps and, with "
                        "CROSSCHECK_MINIMIND set, record_loop's on MiniMind's train_grpo.py")
    p.add_argument("--loop", action="store_true",
                   help="only record_loop's overhead on MiniMind's train_grpo.py "
                        "(CROSSCHECK_MINIMIND names the checkout)")
    p.add_argument("--child-mem", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_mem:
        B, T, dtype, mask, impl = args.child_mem
        return _child_mem(int(B), int(T), dtype, mask, impl)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print(f"load average before: {load_average()}")
    if args.cards:
        card_table(max(3, args.repeats))
        print(f"\nload average after: {load_average()}")
        return
    if args.live or args.loop:
        if args.live:
            live_table(args.repeats)
        loop_table(args.repeats)
        print(f"\nload average after: {load_average()}")
        return
    sizes = [(64, 1024)] if args.quick else [(64, 1024), (64, 8192), (512, 1024), (512, 8192)]
    gae_table(sizes, args.device, args.repeats)
    if not args.no_harness:
        harness_table(args.repeats)
        command_table(max(3, args.repeats), scale=not args.quick)
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
