"""Test helpers: run a reference function through both twins and both gradient paths, and the
command line in-process. Conversion is the bridge's (crosscheck.bridge), as everywhere else."""
import contextlib
import io
import os

import numpy as np

import ref_numpy
import ref_torch
from crosscheck.bridge import backprop, tensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # the repository
EXAMPLES = os.path.join(ROOT, "examples")
# mutmut (docs/mutation.md) sets MUTANT_UNDER_TEST; its trampolines wrap every function of the
# mutated packages in one shared wrapper, which a profiler cannot tell apart
UNDER_MUTMUT = bool(os.environ.get("MUTANT_UNDER_TEST"))


def both(name, *args, **kwargs):
    """(ref_numpy output, ref_torch output as numpy) for the same float64 inputs."""
    out_np = getattr(ref_numpy, name)(*args, **kwargs)
    out_t = getattr(ref_torch, name)(*[tensor(a) for a in args],
                                     **{k: tensor(v) for k, v in kwargs.items()})
    if isinstance(out_t, tuple):
        return out_np, tuple(o.numpy() for o in out_t)
    return out_np, out_t.detach().numpy()


def grads(name, wrt, g, *args, **kwargs):
    """(hand VJP, torch autograd) of ⟨g, name(*args)⟩ wrt the positional argument `wrt` (index)."""
    hand = getattr(ref_numpy, name + "_vjp")(g, *args, **kwargs)
    targs = [tensor(a) for a in args]
    targs[wrt] = targs[wrt].clone().requires_grad_(True)
    out = getattr(ref_torch, name)(*targs, **{k: tensor(v) for k, v in kwargs.items()})
    (auto,) = backprop(out, g, [targs[wrt]])
    key = list(hand)[0] if len(hand) == 1 else None
    return hand, auto, key


def close(actual, expected, atol=1e-12, rtol=1e-12):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                               np.asarray(expected, dtype=np.float64), atol=atol, rtol=rtol,
                               strict=True)


def run_cli(argv):
    """(exit code, stdout, stderr) of `python -m crosscheck argv...`, run in-process; an
    argparse usage error (SystemExit) gives its exit code and message like any other."""
    from crosscheck import __main__ as cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()
