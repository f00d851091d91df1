"""A function that writes to its inputs in place is reported as such, a failing `inputs`
check, never a traceback: a trainer reads its mask and advantages again after the loss."""
import numpy as np
import torch

from crosscheck import audit
from tests.audit.corpus import N, failing, finding, ppo

correct = ppo()


def test_a_mask_mutated_in_place_after_the_loss_is_reported():
    def zeroes_mask(logp, old_logp, advantages, mask):
        out = correct(logp, old_logp, advantages, mask)
        mask.zero_()             # autograd saved mask: backward would raise on it
        return out
    report = audit(zeroes_mask, "ppo_clip_loss", cases=N)
    assert failing(report) == {"inputs"}, str(report)
    f = finding(report, "inputs")
    assert f.grade == "deviation"
    assert "changed its input mask (" in f.message and "in place" in f.message, f.message
    assert "inputs after your call" in f.counterexample


def test_advantages_mutated_in_place_are_reported():
    def doubles_advantages(logp, old_logp, advantages, mask):
        out = correct(logp, old_logp, advantages, mask)
        advantages.mul_(2.0)
        return out
    report = audit(doubles_advantages, "ppo_clip_loss", cases=N)
    assert failing(report) == {"inputs"}, str(report)
    assert "changed its input advantages (" in finding(report, "inputs").message


def test_an_input_mutated_in_place_with_numpy_is_reported():
    def whitens_in_place(x, mask):
        m = mask.astype(bool)
        v = x[m]
        out = np.where(m, (x - v.mean()) / np.sqrt(v.var() + 1e-8), 0.0)
        x[...] = out
        return out
    report = audit(whitens_in_place, "whiten", backend="numpy", cases=8, profile="minimind")
    assert failing(report) == {"inputs"}, str(report)
    assert "changed its input x (" in finding(report, "inputs").message


def test_a_function_that_leaves_its_inputs_alone_lists_no_inputs_check():
    report = audit(correct, "ppo_clip_loss", cases=8)
    assert report.ok and all(f.check != "inputs" for f in report.findings), str(report)


def test_a_backward_that_raises_is_a_grad_failure_not_a_traceback():
    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("no backward here")

    def fn(logp, old_logp, advantages, mask):
        return correct(Boom.apply(logp), old_logp, advantages, mask)
    report = audit(fn, "ppo_clip_loss", cases=4)
    assert "grad" in failing(report), str(report)
    assert "no backward here" in finding(report, "grad").message
