"""ref_torch computes in its inputs' dtype and returns it (the precision table is issue 6's)."""
import numpy as np
import pytest
import torch

from crosscheck import cases, registry
from crosscheck.harness import _outputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(registry.build()))
def test_output_dtype_follows_input(name, dtype):
    entry = registry.build()[name]
    case = entry.case(cases.rng_for(0, name, 0), 0)          # a plain 3×7 case
    t = {k: (None if v is None else
             torch.from_numpy(v.copy()).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v))
         for k, v in case.arrays.items()}
    outs = entry.torch_fn(**t, **case.params)
    outs = [outs[k] for k in entry.outputs] if entry.dict_output else \
        (outs if isinstance(outs, tuple) else (outs,))
    refs = _outputs(entry.numpy_fn(**case.arrays, **case.params), entry.outputs)
    for o, r in zip(outs, refs):
        assert o.dtype == dtype
        assert torch.isfinite(o).all()
        # a loose sanity bound only (64 eps of the dtype times the output scale), not a derived
        # tolerance: the derived per-function precision table belongs to the reliability work
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(o.double().numpy() - r).max() <= 64 * torch.finfo(dtype).eps * scale
