"""Benchmarks: GAE implementations side by side, and the harness's own speed.

    python benchmarks/run.py                 # CPU, the full table (about 5 minutes here)
    python benchmarks/run.py --quick         # smaller sizes only
    python benchmarks/run.py --device cuda   # the torch rows on a GPU

Every figure is a median over repeats, and every comparison a ratio against a baseline timed in
turn with it (one call each per round): the verl-style per-step torch loop (written here from
the GAE recursion, as verl, TRL and OpenRLHF write it). The bandwidth bound is (bytes read +
written) ÷ the bandwidth of a 32 MiB copy timed in turn with the same calls; "peak extra
memory" is the peak resident (or CUDA) memory a call adds, over the bytes of its inputs.
Errors are against ref_numpy's float64 recursion.
No timing is asserted anywhere: this prints, the reader judges.
"""
import argparse
import os
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


def interleaved_medians(fs, repeats, device="cpu"):
    """The median time of each callable of fs, timed in turns: one call of each per round
    (fs[i] in its first repeats[i] rounds), after one untimed warm-up call each. On a shared,
    noisy host a slow spell then slows every callable alike, so their ratios hold even when the
    times themselves drift."""
    for f in fs:
        f()
    sync(device)
    times = [[] for _ in fs]
    for k in range(max(repeats)):
        for f, n, ts in zip(fs, repeats, times):
            if k < n:
                t0 = time.perf_counter()
                f()
                sync(device)
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


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
    """One row per implementation, size, dtype and mask. The implementations of one row group
    and a 32 MiB copy are timed in turns (interleaved_medians): the speed-ups and the bandwidth
    bound are ratios of times taken in the same seconds. Returns the rows."""
    copy = copy_timer(device)
    head = ("| B | T | dtype | mask | impl | median | speed-up vs loop | × copy bound | "
            "peak extra mem / input | max rel err |")
    print()
    print(head)
    print("|---" * 10 + "|")
    rows, bandwidths = [], []
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
                impls = [("per-step loop", lambda: verl_loop(rt, vt, mt)),
                         ("ref_torch.gae", lambda: ref_torch.gae(rt, vt, mt, gamma=GAMMA, lam=LAM))]
                if dtype == torch.float64 and device == "cpu":
                    impls.append(("ref_numpy.gae",
                                  lambda: ref_numpy.gae(r64, v64, m, gamma=GAMMA, lam=LAM)))
                    if mask_name == "right":
                        impls.append(("scipy lfilter", lambda: lfilter_gae(r64, v64, lengths)))
                reps = [max(1, repeats if (T * B < 2e6 or name != "per-step loop") else 3)
                        for name, _ in impls]
                *times, t_copy = interleaved_medians([f for _, f in impls] + [copy],
                                                     reps + [max(reps)], device)
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
                           t / bound, mem, err)
                    rows.append(row)
                    print(f"| {B} | {T} | {row[2]} | {mask_name} | {name} | {t * 1e3:.2f} ms | "
                          f"{base / t:.1f}× | {t / bound:.1f} | {mem or '-'} | {err:.1e} |",
                          flush=True)
    print(f"\ncopy bandwidth ({device}; 32 MiB, read + write, timed in turn with each row group): "
          f"{min(bandwidths) / 1e9:.1f}–{max(bandwidths) / 1e9:.1f} GB/s, median "
          f"{statistics.median(bandwidths) / 1e9:.1f}")
    return rows


def harness_table(repeats):
    """Cases per second per stage, and the whole default run."""
    from crosscheck import harness, registry

    entries = registry.build()
    print()
    print("| stage | cases/s (all functions, 12 cases each) |")
    print("|---|---|")
    for stage in harness.STAGES:
        t0 = time.perf_counter()
        n = 0
        for e in entries.values():
            n += sum(r.cases for r in harness.run_entry(e, 0, 12, stages=(stage,)))
        dt = time.perf_counter() - t0
        print(f"| {stage} | {n / dt:.0f} ({n} cases in {dt:.2f} s) |")
    t = median_time(lambda: harness.run(entries, seed=0, n_cases=12), max(1, repeats // 2))
    print(f"\nthe default run (`python -m crosscheck`, in-process, torch already imported): "
          f"{t:.1f} s")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--quick", action="store_true", help="only B=64, T=1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-harness", action="store_true")
    p.add_argument("--child-mem", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_mem:
        B, T, dtype, mask, impl = args.child_mem
        return _child_mem(int(B), int(T), dtype, mask, impl)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    sizes = [(64, 1024)] if args.quick else [(64, 1024), (64, 8192), (512, 1024), (512, 8192)]
    gae_table(sizes, args.device, args.repeats)
    if not args.no_harness:
        harness_table(args.repeats)


if __name__ == "__main__":
    main()
