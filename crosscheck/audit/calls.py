"""Calling the audited function: which inputs it takes (and under which names), under a
deadline, on cases padded the way trainers pad them.

The adapter contract, as the audit applies it:
- the reference's data inputs are passed by keyword, under the reference's names, or under
  the function's own names where `rename` maps them (`{"log_prob": "logp"}`);
- an optional input (valid rows, dones, last_value, group ids, sample logits, the global counts
  `n_tokens_global` / `n_sequences_global`) is passed only to a function that names it:
  **kwargs does not receive it. A function that names one *without a default* always gets it:
  where a case has none, its neutral value (no dones, a zero bootstrap value, every row valid,
  samples from the policy itself; the global counts of the whole batch);
- a required parameter that is none of these is a mapping problem: the cases are skipped and the
  report says which names the reference passes and how to map them.
"""
import difflib
import inspect
import os
import queue
import threading
import traceback
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from ref_common import vocab

from ..check import cases as cases_mod

TIMEOUT = 60.0                   # seconds per call of the audited function (cases are small)
STRUCTURAL = ("group_size", "group_ids", "valid")
GLOBAL_KW = ("n_tokens_global", "n_sequences_global")


class AuditTimeout(BaseException):
    """The audited function did not return within the deadline. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` reporting a user error swallows it: the
    audit must stop, not wait again on every remaining case."""


class UserRaised(Exception):
    """The audited function raised something that is not an Exception (SystemExit,
    KeyboardInterrupt, GeneratorExit): recorded as a failure of `raises`, never the end of the
    audit."""

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


class InputMutated(Exception):
    """The audited function wrote to one of its inputs in place: a failure of the `inputs`
    check. Carries what it returned (`output`) and the inputs as they were left (`after`)."""

    def __init__(self, message: str, output=None, after=None):
        super().__init__(message)
        self.output, self.after = output, after or {}


def snapshot(kwargs):
    """A copy of every array or tensor passed, to compare with after the call."""
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
        elif isinstance(v, np.ndarray):
            out[k] = v.copy()
    return out


def mutated(before, kwargs):
    """{input: (entries changed, entries, first changed index, was, is)} for each input the
    call changed in place (NaN equal to NaN; a changed shape counts every entry)."""
    out = {}
    for k, old in before.items():
        new = kwargs[k]
        a = old.cpu().numpy() if isinstance(old, torch.Tensor) else old
        b = new.detach().cpu().numpy() if isinstance(new, torch.Tensor) else new
        if a.shape != b.shape:
            out[k] = (a.size, a.size, None, a.shape, b.shape)
            continue
        same = a == b
        if a.dtype.kind in "fc":
            same |= np.isnan(a) & np.isnan(b)
        if not same.all():
            i = tuple(int(j) for j in np.argwhere(~same)[0])
            out[k] = (int((~same).sum()), a.size, i, a[i].item(), b[i].item())
    return out


def mutation_message(changes) -> str:
    parts = [f"{k} ({n} of {size} entries" + (f"; shape {was} became {now})" if i is None else
                                             f"; at {list(i)}: {was!r} became {now!r})")
             for k, (n, size, i, was, now) in changes.items()]
    return (f"your function changed its input{'s' * (len(changes) > 1)} {', '.join(parts)} in "
            f"place: the caller's batch is altered for whatever reads it next (a trainer reads "
            f"its mask and advantages again after the loss); work on a copy")


class ProcessExit(BaseException):
    """The audited function called os._exit, which would end the audit's process at once (no
    verdict, and an exit status the function chose, 0 reading as a pass): raised in its place
    and recorded as a failure of `raises`, as sys.exit's SystemExit is."""


_calling = threading.local()          # .pid: the process whose audit call this thread runs
_real_exit = os._exit


def _guarded_exit(status):
    """os._exit, except inside an audited call of this process (a process the function forks
    exits as it would)."""
    if getattr(_calling, "pid", None) == os.getpid():
        raise ProcessExit(f"your function called os._exit({status}), which ends the process")
    _real_exit(status)


def exception_text(exc: BaseException) -> str:
    """'Type: message' of what the user's code raised (a UserRaised unwrapped; the bare type
    name when the message is empty)."""
    original = getattr(exc, "original", exc)
    text = str(original)
    return type(original).__name__ + (f": {text}" if text else "")


class _Worker:
    """A daemon thread that runs the audited calls handed to it, one at a time: starting a
    thread for every call costs more than most audited functions (thousands of calls a card)."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="crosscheck-audit-call",
                                       daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            self.jobs.get()()


_workers = threading.local()          # each calling thread hands its calls to its own worker


def call_with_deadline(fn, kwargs, timeout):
    """fn(**kwargs) in a worker thread (carrying torch's thread-local grad mode); raise
    AuditTimeout if it has not returned after `timeout` seconds (None: wait as long as it
    takes). Whatever the function raises comes back as an Exception (UserRaised for a
    BaseException), so that no user code can end the audit; os._exit called by it raises
    ProcessExit instead (a C-level exit still ends the process: the command line runs the
    audit in a child process for that). A real Ctrl-C reaches the caller's
    thread, not the worker, and still stops it. The worker is reused from call to call; one
    left running past its deadline is abandoned, and the next call gets a fresh one."""
    result = {}
    grad_mode = torch.is_grad_enabled()
    done = threading.Event()

    def work():
        _calling.pid = os.getpid()
        try:
            with torch.set_grad_enabled(grad_mode):
                result["value"] = fn(**kwargs)
        except Exception as exc:
            result["error"] = exc
        except BaseException as exc:           # SystemExit, KeyboardInterrupt inside user code
            result["error"] = UserRaised(exc)
        finally:
            _calling.pid = None
            done.set()

    if os._exit is not _guarded_exit:          # installed once; transparent outside a call
        os._exit = _guarded_exit

    worker = getattr(_workers, "worker", None)
    if worker is None:
        worker = _workers.worker = _Worker()
    worker.jobs.put(work)
    if not done.wait(timeout):
        _workers.worker = None                 # still inside the user's call: leave it there
        raise AuditTimeout(f"your function did not return within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


class Adapter:
    """What the audited function takes: its named parameters, which are required, whether it
    has **kwargs or *args, and the renaming of its parameters to the reference's inputs."""

    def __init__(self, fn, inputs: Sequence[str], optional: Sequence[str],
                 rename: Optional[Dict[str, str]] = None):
        self.fn = fn
        self.inputs = tuple(inputs)                   # what the reference can pass
        self.optional = set(optional) | set(GLOBAL_KW)
        self.rename = dict(rename or {})              # the function's name → the reference's
        self.to_fn = {ref: own for own, ref in self.rename.items()}
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):               # a builtin: offer every keyword
            params = None
        if params is None:
            self.named, self.required, self.var_kw, self.var_pos = set(), set(), True, False
        else:
            kinds = inspect.Parameter
            self.named = {n for n, p in params.items()
                          if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
            self.required = {n for n, p in params.items() if n in self.named
                             and p.default is p.empty}
            self.var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params.values())
            self.var_pos = any(p.kind is kinds.VAR_POSITIONAL for p in params.values())
        self.params = [] if params is None else list(params)

    def own(self, ref_name: str) -> str:
        """The function's name for a reference input."""
        return self.to_fn.get(ref_name, ref_name)

    def accepts(self, ref_name: str) -> bool:
        own = self.own(ref_name)
        return own in self.named or (self.var_kw and ref_name not in self.optional
                                     and own == ref_name)

    def requires(self, ref_name: str) -> bool:
        return self.own(ref_name) in self.required

    def unmet(self):
        """The required parameters the audit can never supply (no reference input maps to
        them), in signature order."""
        known = {self.own(n) for n in self.inputs} | {self.own(n) for n in GLOBAL_KW}
        return [n for n in self.params if n in self.required and n not in known]

    def mapping_help(self, ref: str = "the reference") -> str:
        """What the reference passes, what the function takes, and how to map them: a --map is
        suggested only where it gives every required parameter an input (the call then fits)."""
        unmet = self.unmet()
        lines = [f"the reference passes: {', '.join(self.inputs)} (and, to a function that "
                 f"names them, {', '.join(GLOBAL_KW)})",
                 f"your function takes: {', '.join(self.params) or '(nothing by name)'}"]
        pairs = []
        free = [n for n in self.inputs if self.own(n) not in self.named]
        for own in unmet:
            match = difflib.get_close_matches(own, free, n=1, cutoff=0.3)
            if match:
                pairs.append((own, match[0]))
                free.remove(match[0])
        lost = [own for own in unmet if own not in dict(pairs)]
        if lost:
            lines.append(f"no --map makes it fit: your function requires "
                         f"{', '.join(n + '=' for n in unmet)}, and {ref} passes no input to "
                         f"match {', '.join(n + '=' for n in lost)}")
        elif pairs:
            lines.append("map them: --map " + " --map ".join(f"{a}={b}" for a, b in pairs) +
                         " (CLI), or rename={" +
                         ", ".join(f"{a!r}: {b!r}" for a, b in pairs) + "} (API)")
        elif self.var_pos and not self.named:
            lines.append("your function takes *args only: the reference passes its inputs by "
                         "keyword; give it named parameters (or map them with --map)")
        return "; ".join(lines)

    def call_kwargs(self, kwargs: Dict[str, object]) -> Dict[str, object]:
        """The keyword arguments under the function's own names."""
        return {self.own(k): v for k, v in kwargs.items()}


def neutral(name: str, data: Dict[str, object]):
    """The value of an optional input that means 'none': what a case without it has."""
    m = data.get("mask")
    if name == "dones" and m is not None:
        return np.zeros(np.shape(m), dtype=bool)
    if name == "last_value":
        first = data.get("rewards")
        return None if first is None else np.zeros(np.shape(first)[:-1])
    if name == "valid":
        first = data.get("rewards")
        return None if first is None else np.ones(np.shape(first)[0], dtype=bool)
    if name == "sample_logits":
        return None if data.get("logits") is None else np.array(data["logits"], copy=True)
    return None


# Which inputs hold log-probabilities (≤ 0 in every trainer's batch) is a fact of the registry
# entry (Entry.logprobs); where no entry is at hand, ref_common's naming rule (vocab.is_logprob).
LOGITS = ("logits", "ref_logits", "sample_logits")

# Padding inside each input's domain. The main checks pad every log-prob input with one shared
# plausible log-prob (trainers pad logp, old and ref log-probs alike: a log-ratio of 0 there) and
# every other input with its own finite value (a term left unmasked cannot vanish at padding by
# two inputs holding the same value there). The mask check adds two more in-domain paddings,
# one shared and one where the log-probs differ; garbage (NaN, ±inf, ±1e4, positive log-probs)
# is the robustness check's alone (crosscheck.audit.auditor).
LOGP_PAD = -0.7
_PAD_NAMES = ("advantages", "values", "old_values", "returns", "rewards", "x", "loss", "scores",
              "baselines", "sum_pi_squared")
PAD_VALUES = {n: v for n, v in zip(_PAD_NAMES, (0.6, 1.3, -0.9, 2.1, 0.35, 1.7, 0.8, 0.45, 0.55,
                                                0.3))}
# the mask check's in-domain paddings: (label, the log-probs' fill by input, the others' scale)
IN_DOMAIN = (("shared log-probs", -2.3, -1.5),
             ("differing log-probs", dict(logp=-0.2, old_logp=-3.1, ref_logp=-1.4,
                                          rollout_logp=-4.6), 2.0))
# the robustness check's garbage: (label, the log-probs' fill, the others' and the logits' fill;
# None: their in-domain padding)
GARBAGE = (("1e4", 1e4, 1e4), ("-1e4", -1e4, -1e4), ("NaN", np.nan, np.nan),
           ("inf", np.inf, np.inf), ("positive log-probs", 5.0, None))


def pad_value(name: str, base: float = 1.0) -> float:
    """The finite, in-domain value input `name` is padded with (scaled by `base` for the mask
    check's second padding; log-probs keep their sign)."""
    if vocab.is_logprob(name):
        return LOGP_PAD
    return base * PAD_VALUES.get(name, 0.45 + 0.1 * (sum(map(ord, name)) % 7))


def pad_logits(shape, base: float = 1.0) -> np.ndarray:
    """Finite logits for one masked position of [.., V] logits: a fixed ramp over the
    vocabulary (scaled by `base`)."""
    V = shape[-1]
    return base * np.linspace(-1.0, 1.0, V) if V > 1 else np.full(V, base * 0.5)


def logprob_names(arrays, names=None):
    """The log-prob inputs among `arrays`: `names` (a registry entry's), else by ref_common's
    naming rule."""
    return tuple(k for k in arrays if (k in names if names is not None else vocab.is_logprob(k)))


def _logp_fill(logprobs, name):
    """One log-prob input's padding: `logprobs` itself (a number: every log-prob input alike),
    logprobs[name] (a dict), and for a name the dict lacks one of its own (distinct, ≤ 0)."""
    if logprobs is None:
        return LOGP_PAD
    if not isinstance(logprobs, dict):
        return logprobs
    if name in logprobs:
        return logprobs[name]
    return -(0.3 + 0.1 * (sum(map(ord, name)) % 41))


def fill_padding(arrays, logprobs=None, base: float = 1.0, logits_fill=None, names=None):
    """`arrays` with every masked entry (a [B, T] input at ~mask, a [B] input of an all-masked
    row or an invalid row, a [B, T, V] logits row at ~mask) replaced: log-probs (the inputs
    `names`, by default those named as log-probs) by `logprobs` (one number for all, or a dict
    by name; default: the shared LOGP_PAD), the others by pad_value(name, base) (or by `base`
    itself where it is not finite: garbage), logits by pad_logits (or `logits_fill`)."""
    arrays = dict(arrays)
    m = arrays.get("mask")
    valid = arrays.get("valid")
    lps = logprob_names(arrays, names)
    for k, v in list(arrays.items()):
        if v is None or not isinstance(v, np.ndarray) or v.dtype.kind != "f":
            continue
        if k in lps:
            value = _logp_fill(logprobs, k)
        elif not np.isfinite(base):
            value = base
        else:
            value = pad_value(k, base)
        if m is not None and v.shape == m.shape:
            arrays[k] = np.where(m, v, value)
        elif m is not None and k in LOGITS and v.shape[:-1] == m.shape:
            fill = pad_logits(v.shape, 1.0 if not np.isfinite(base) else base) \
                if logits_fill is None else np.full(v.shape[-1], logits_fill)
            arrays[k] = np.where(np.asarray(m, dtype=bool)[..., None], v, fill)
        elif m is not None and v.ndim == 1 and v.shape[0] == m.shape[0] and m.ndim == 2:
            arrays[k] = np.where(np.asarray(m, dtype=bool).any(axis=1), v, value)
        if valid is not None and v.shape == valid.shape:
            arrays[k] = np.where(valid, arrays[k], value)
    return arrays


def log_probs_in_domain(arrays, names=None):
    """`arrays` with every log-prob input (`names`, by default those named as log-probs)
    shifted by one constant so that the largest valid log-prob is ≤ 0 (a case's log-ratios, the
    only thing most functions read, are unchanged): a trainer's log-probs are never positive."""
    m = arrays.get("mask")
    top = -np.inf
    lps = logprob_names(arrays, names)
    for k in lps:
        v = arrays.get(k)
        if isinstance(v, np.ndarray) and v.size:
            at = v[np.asarray(m, dtype=bool)] if m is not None and v.shape == m.shape else v
            at = at[np.isfinite(at)]
            if at.size:
                top = max(top, float(at.max()))
    if not top > 0:
        return arrays
    return {k: (v - top if k in lps and isinstance(v, np.ndarray) else v)
            for k, v in arrays.items()}


def finite_padding(case, names=None):
    """The case as a trainer's batch holds it: log-probs (`names`) ≤ 0, and every masked /
    invalid entry replaced by a finite value inside its input's domain (see fill_padding)."""
    arrays = fill_padding(log_probs_in_domain(case.arrays, names), names=names)
    return cases_mod.Case(case.label, arrays, case.params, case.stages, case.fd_step)


def as_trainer_batch(case):
    """The case as a trainer holds it: only structural params (the audit brings the conventions),
    and a single [T] trajectory becomes [1, T] (trainers hold batches)."""
    structural = {k: v for k, v in case.params.items() if k in STRUCTURAL}
    arrays = dict(case.arrays)
    m = arrays.get("mask")
    if m is not None and m.ndim == 1:
        arrays = {k: (v[None] if isinstance(v, np.ndarray) and v.shape == m.shape else
                      (v.reshape(1) if isinstance(v, np.ndarray) and v.ndim == 0 else v))
                  for k, v in arrays.items()}
    return cases_mod.Case(case.label, arrays, structural, case.stages, case.fd_step)


def audit_case(entry, seed: int, i: int):
    """Case `i` of `entry` under `seed` as the audit runs it: drawn by the registry's generator,
    padded with finite values (each input its own) and shaped as a trainer's batch."""
    return as_trainer_batch(finite_padding(entry.case(cases_mod.rng_for(seed, entry.name, i), i),
                                           entry.logprobs))


def reference_args(data):
    """The data as the reference takes it: the adapter may be given both group_size and the
    equivalent group_ids; the reference takes exactly one, so group_size wins. The global
    counts are the audit's, not the reference's."""
    out = {k: v for k, v in data.items() if k not in GLOBAL_KW}
    if "group_size" in out:
        out.pop("group_ids", None)
    return out


def degenerate(data) -> Optional[str]:
    """Why a batch is degenerate, where a trainer may rightly refuse it, or None: a group of
    one, an empty row, a one-token row, fewer than two valid tokens or rows."""
    ids = data.get("group_ids")
    size = data.get("group_size")
    if ids is not None and len(ids):
        _, counts = np.unique(np.asarray(ids), return_counts=True)
        if (counts < 2).any():
            return "a group of one"
    elif size == 1:
        return "a group of one"
    m = data.get("mask")
    if m is not None:
        m = np.asarray(m, dtype=bool)
        rows = m.sum(axis=-1) if m.ndim == 2 else np.array([m.sum()])
        if m.sum() < 2:
            return "fewer than two valid tokens"
        if (rows == 0).any():
            return "an empty row"
        if (rows == 1).any():
            return "a one-token row"
    for key in ("rewards",):
        v = data.get(key)
        if v is not None and np.ndim(v) == 1 and len(v) < 2:
            return "a single row"
    return None


_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raised_in_ours(exc: BaseException) -> bool:
    """Whether the innermost frame outside the libraries (torch, numpy, the standard library)
    is crosscheck's (an adapter, a stand-in), not the user's or the trainer's code."""
    exc = getattr(exc, "original", exc)
    libs = (os.path.dirname(torch.__file__), os.path.dirname(np.__file__))
    stdlib = os.path.dirname(os.__file__)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.abspath(frame.filename)
        if path.startswith(libs) or "<frozen" in frame.filename or \
                path.startswith(stdlib) and "-packages" not in path:
            continue
        return path.startswith(_OURS)
    return True


def where_raised(exc: BaseException) -> str:
    """'file:line in function' of the innermost frame outside crosscheck and the libraries
    (torch, numpy, the standard library): the line of the user's or the trainer's code."""
    exc = getattr(exc, "original", exc)
    frames = traceback.extract_tb(exc.__traceback__)
    libs = (os.path.dirname(torch.__file__), os.path.dirname(np.__file__))
    stdlib = os.path.dirname(os.__file__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if path.startswith(_OURS) or path.startswith(libs) or "<frozen" in frame.filename:
            continue
        if path.startswith(stdlib) and "-packages" not in path:
            continue
        shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        return f"{shown}:{frame.lineno} in {frame.name}"
    return "(no frame of your code)"
