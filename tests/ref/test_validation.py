"""Bad input gets a ValueError/TypeError that names the argument, what it got and what it expected,
from both twins alike (the validation is the one thing they share)."""
import math
import re

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck.bridge import tensor as to_torch

TWINS = ["numpy", "torch"]


def call(twin, name, *args, **kwargs):
    if twin == "numpy":
        return getattr(ref_numpy, name)(*args, **kwargs)
    return getattr(ref_torch, name)(*[to_torch(a) for a in args],
                                    **{k: to_torch(v) for k, v in kwargs.items()})


LP = np.full((3, 7), -1.0)
A = np.ones((3, 7))
M = np.ones((3, 7), dtype=bool)

CASES = [
    # (function, args, kwargs, error, pattern the message must match)
    ("ppo_clip_loss", (np.zeros((2, 3, 4)), np.zeros((2, 3, 4)), np.zeros((2, 3, 4))), {},
     ValueError, r"logp has shape \(2, 3, 4\); expected \[B, T\]"),
    ("ppo_clip_loss", (LP, np.zeros((3, 5)), A), {},
     ValueError, r"old_logp has shape \(3, 5\) but logp has \(3, 7\); both must be \[B, T\]"),
    ("ppo_clip_loss", (LP, LP, np.ones(7)), {},
     ValueError, r"advantages has shape \(7,\) but logp has \(3, 7\); expected per token "
                 r"\(3, 7\) or one per sequence \[B\] = \(3,\)"),
    ("ppo_clip_loss", (LP, LP, np.ones((3, 1))), {},
     ValueError, r"advantages has shape \(3, 1\)"),
    ("ppo_clip_loss", (LP.astype(np.int64), LP, A), {},
     TypeError, r"logp has dtype int64; expected a floating-point array"),
    ("ppo_clip_loss", (LP, LP, np.where(np.eye(3, 7) > 0, np.nan, 1.0)), {},
     ValueError, r"advantages is nan at valid position \(0, 0\); only masked positions"),
    ("ppo_clip_loss", (LP, LP, A), {"clip_c": 1.0},
     ValueError, r"clip_c is 1.0; the dual clip needs c > 1"),
    ("ppo_clip_loss", (LP, LP, A), {"clip_c": 0.5}, ValueError, r"clip_c is 0.5"),
    ("ppo_clip_loss", (LP, LP, A), {"clip_low": -0.1},
     ValueError, r"clip_low is -0.1; expected a value in \[0.0, 1.0\)"),
    ("ppo_clip_loss", (LP, LP, A), {"clip_low": "0.2"},
     TypeError, r"clip_low is '0.2' of type str; expected a real number"),
    ("ppo_clip_loss", (LP, LP, A, np.full((3, 7), 2)), {},
     ValueError, r"mask holds 2; expected only 0/1"),
    ("ppo_clip_loss", (LP, LP, A, np.ones((3, 6), dtype=bool)), {},
     ValueError, r"mask has shape \(3, 6\) but logp has \(3, 7\)"),
    ("cispo_loss", (LP, LP, A), {"bound": "delta"},
     ValueError, r"bound is 'delta'; expected one of 'absolute', 'relative'"),
    ("cispo_loss", (LP, LP, A), {"clip_low": 0.2},
     ValueError, r"clip_low is 0.2, but bound='absolute' has no lower bound"),
    ("cispo_loss", (LP, LP, A), {"clip_high": 0.0},
     ValueError, r"clip_high is 0.0; expected a value in \(0.0, inf\]"),
    ("whiten", (np.ones((2, 3)),), {"eps": -1e-8},
     ValueError, r"eps is -1e-08; expected a value in \[0.0, inf\]"),
    ("whiten", (np.array([1.0, 2.0]), np.array([1, 0])), {"ddof": 1},
     ValueError, r"mask has 1 valid entries; whiten with ddof=1 needs at least 2"),
    ("whiten", (np.ones(3),), {"eps": 0.0},
     ValueError, r"x has zero variance over its 3 valid entries and eps=0"),
    ("whiten", (np.ones(3),), {"ddof": 2},
     ValueError, r"ddof is 2; expected 0 \(biased"),
    ("whiten", (np.ones(3),), {"eps_mode": "sqrt"},
     ValueError, r"eps_mode is 'sqrt'; expected one of 'var', 'clamp', 'std'"),
    ("group_advantages", (np.ones(8),), {"group_size": 3},
     ValueError, r"group_size is 3 but rewards has B = 8 rows; group_size must divide B"),
    ("group_advantages", (np.ones(8),), {},
     ValueError, r"needs exactly one of group_size= or group_ids=; got neither"),
    ("group_advantages", (np.ones(4),), {"group_size": 2, "group_ids": np.zeros(4, dtype=int)},
     ValueError, r"got both"),
    ("group_advantages", (np.ones(4),), {"group_ids": np.zeros(3, dtype=int)},
     ValueError, r"group_ids has shape \(3,\); expected \[B\] = \(4,\)"),
    ("group_advantages", (np.ones(4),), {"group_ids": np.zeros(4)},
     TypeError, r"group_ids has dtype float64; expected integers"),
    ("group_advantages", (np.ones((2, 2)),), {"group_size": 2},
     ValueError, r"rewards has shape \(2, 2\); expected one value per sequence \[B\]"),
    ("group_advantages", (np.array([1.0, 1.0, 0.0, 1.0]),), {"group_size": 2, "eps": 0.0},
     ValueError, r"rewards of row 0's group have zero spread and eps=0"),
    ("group_advantages", (np.ones(4),), {"group_size": 2, "scale": "global"},
     ValueError, r"scale is 'global'; expected one of 'group', 'batch', 'leave_one_out', 'mean', 'none'"),
    ("group_advantages", (np.ones(4),), {"group_size": 2, "scale": "leave_one_out"},
     ValueError, r"scale is 'leave_one_out' but baseline is 'mean'"),
    ("group_advantages", (np.ones(4),), {"group_size": 2, "valid": np.ones(3, dtype=bool)},
     ValueError, r"valid has shape \(3,\) but rewards has \(4,\)"),
    ("ppo_clip_loss", (LP, LP, A), {"delta": 1.1},
     ValueError, r"delta is 1.1 but the upper clip edge 1 \+ clip_high is 1.2"),
    ("ppo_clip_loss", (LP, LP, A), {"delta": 0.9},
     ValueError, r"delta is 0.9; an absolute ratio cap must exceed 1"),
    ("gspo_loss", (LP, LP, A), {"form": "product"},
     ValueError, r"form is 'product'; expected one of 'token', 'sequence'"),
    ("clip_fraction", (LP, LP, A), {"definition": "abs"},
     ValueError, r"definition is 'abs'; expected one of 'loss', 'sign', 'ratio'"),
    ("approx_kl", (LP, LP), {"kind": "abs"},
     ValueError, r"kind is 'abs'; expected one of 'k1', 'k2', 'k3'"),
    ("discounted_returns", (LP,), {"gamma": -0.1},
     ValueError, r"gamma is -0.1; expected a value in \[0.0, 1.0\]"),
    ("gae", (LP, LP), {"gamma": 1.5, "lam": 0.9},
     ValueError, r"gamma is 1.5; expected a value in \[0.0, 1.0\]"),
    ("gae", (LP, LP), {"gamma": 0.9, "lam": 0.9, "last_value": np.ones((3, 1))},
     ValueError, r"last_value has shape \(3, 1\); expected one value per sequence \(3,\)"),
    ("gae", (LP, LP), {"gamma": 0.9, "lam": 0.9, "dones": np.full((3, 7), 0.5)},
     ValueError, r"dones holds 0.5; expected only 0/1"),
    ("kl_penalty", (LP, LP), {"kind": "k4"},
     ValueError, r"kind is 'k4'; expected one of 'k1', 'k2', 'k3', 'abs'"),
    ("kl_penalty", (LP, LP), {"clamp": 10.0},
     ValueError, r"clamp is 10.0; expected None or a pair \(input_bound, output_bound\)"),
    ("kl_penalty", (LP, LP), {"clamp": (20.0, -1.0)},
     ValueError, r"clamp\[1\] is -1.0; expected a value in \(0.0, inf\]"),
    ("aggregate", (LP, M), {"mode": "mean"},
     ValueError, r"mode is 'mean'; expected one of 'token-mean'"),
    ("aggregate", (LP, None), {},
     ValueError, r"mask is None; aggregate needs the \[B, T\] mask"),
    ("aggregate", (LP, M), {"norm": 4.0},
     ValueError, r"norm is 4.0 but mode is 'seq-mean-token-mean'"),
    ("value_loss", (LP, LP, LP), {"clip": -0.2},
     ValueError, r"clip is -0.2; expected a value in \(0.0, inf\]"),
    ("policy_objective", (LP, LP, A, M), {"beta": 0.1},
     ValueError, r"beta is 0.1 but ref_logp is None"),
    ("policy_objective", (LP, LP, A, M), {"loss": "grpo"},
     ValueError, r"loss is 'grpo'; expected one of 'ppo', 'cispo'"),
]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("name, args, kwargs, error, pattern", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_gets_a_clear_error(twin, name, args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        call(twin, name, *args, **kwargs)


def test_inf_at_a_valid_position_is_named_with_its_index():
    lp = LP.copy()
    lp[2, 5] = -math.inf
    for twin in TWINS:
        with pytest.raises(ValueError, match=re.escape("logp is -inf at valid position (2, 5)")):
            call(twin, "kl_penalty", lp, LP)


def test_torch_twin_rejects_arrays_mixed_dtypes_and_devices():
    with pytest.raises(TypeError, match="logp is a ndarray; ref_torch expects a torch.Tensor"):
        ref_torch.kl_penalty(LP, torch.tensor(LP))
    with pytest.raises(TypeError, match="ref_logp has dtype float32 but logp has "
                                        "float64"):
        ref_torch.kl_penalty(torch.tensor(LP), torch.tensor(LP, dtype=torch.float32))
    with pytest.raises(TypeError, match="advantages has dtype float32"):
        ref_torch.ppo_clip_loss(torch.tensor(LP), torch.tensor(LP),
                                torch.tensor(A, dtype=torch.float32))


def test_vjp_cotangent_shape_is_checked():
    with pytest.raises(ValueError, match=r"g has shape \(3, 6\) but logp has \(3, 7\)"):
        ref_numpy.ppo_clip_loss_vjp(np.ones((3, 6)), LP, LP, A)
    with pytest.raises(ValueError, match=r"g has shape \(2,\); aggregate returns a scalar"):
        ref_numpy.aggregate_vjp(np.ones(2), LP, M)
    with pytest.raises(TypeError, match=r"g must be a pair"):
        ref_numpy.gae_vjp(np.ones((3, 7)), LP, LP, gamma=0.9, lam=0.9)


def test_unsigned_integer_masks_and_group_ids_are_accepted_as_integers():
    """uint8 masks (as some data loaders store them) and uint8 group ids mean what the bool and
    int64 ones do."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5))
    m = rng.random((3, 5)) < 0.7
    m[:, 0] = True
    np.testing.assert_array_equal(ref_numpy.whiten(x, m.astype(np.uint8)), ref_numpy.whiten(x, m))
    r = rng.normal(size=6)
    ids = np.array([0, 1, 0, 1, 2, 2])
    np.testing.assert_array_equal(ref_numpy.group_advantages(r, group_ids=ids.astype(np.uint8)),
                                  ref_numpy.group_advantages(r, group_ids=ids))


def test_a_whitening_cotangent_of_the_wrong_shape_names_g_and_x():
    with pytest.raises(ValueError, match=r"^g has shape \(2, 2\) but x has \(2, 3\); both must "
                                         r"be \[B, T\]$"):
        ref_numpy.whiten_vjp(np.ones((2, 2)), np.ones((2, 3)), mask=np.ones((2, 3)))
