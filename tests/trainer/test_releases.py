"""Adapters that follow a trainer's interface across releases: each range of releases gets the
adapter its interface needs, a mode a release lacks is NOT IN THIS VERSION, and an interface no
adapter knows is COULD NOT ADAPT. The classes and files here are written for these tests: they
have the signatures and statement shapes of the releases named (read in each release's code),
and the plain math of each mode, nothing more."""
import inspect
import math
import textwrap

import pytest
import torch

from crosscheck.trainer import blocks, card, get
from crosscheck.trainer import openrlhf as orl
from crosscheck.trainer import trl as trl_card


def _masked_mean(x, m, dim=None):
    return (x * m).sum(dim=dim) / m.sum(dim=dim)


class _Base:
    """PPO with the token-level loss, the common part of every release's PolicyLoss."""
    def _ppo(self, log_probs, old_log_probs, advantages):
        ratio = (log_probs - old_log_probs).exp()
        s1, s2 = ratio * advantages, ratio.clamp(1 - self.lo, 1 + self.hi) * advantages
        return -torch.min(s1, s2), s1, s2


class Loss085(_Base):                    # 0.8.5: PPO only, no counts, (loss, clip_ratio)
    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, token_level_loss=True):
        self.lo, self.hi = clip_eps_low, clip_eps_high

    def __call__(self, *a, **k):
        return self.forward(*a, **k)

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None):
        loss, s1, s2 = self._ppo(log_probs, old_log_probs, advantages)
        return _masked_mean(loss, action_mask), _masked_mean((s2 < s1).float(), action_mask)


class Loss092(Loss085):                  # 0.9.2: use_icepop or the token clamp, [low, high]
    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                 policy_loss_type="ppo", enable_vllm_is_correction=False,
                 vllm_is_truncated_threshold=None, use_icepop=False):
        super().__init__(clip_eps_low, clip_eps_high)
        self.on, self.band, self.icepop = (enable_vllm_is_correction,
                                           vllm_is_truncated_threshold, use_icepop)

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                rollout_log_probs=None):
        loss, s1, s2 = self._ppo(log_probs, old_log_probs, advantages)
        if self.on:
            w = (old_log_probs - rollout_log_probs).exp()
            lo, hi = self.band
            w = w * ((w >= lo) & (w <= hi)) if self.icepop else w.clamp(lo, hi)
            loss = w * loss
        ppo_kl = _masked_mean(-(log_probs - old_log_probs), action_mask)
        return _masked_mean(loss, action_mask), _masked_mean((s2 < s1).float(), action_mask), \
            ppo_kl, None


class Loss0910(Loss092):                 # 0.8.10-0.9.1: an upper bound only, no type
    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                 policy_loss_type="ppo", enable_vllm_is_correction=False,
                 vllm_is_truncated_threshold=None):
        super().__init__(clip_eps_low, clip_eps_high, enable_vllm_is_correction=
                         enable_vllm_is_correction)
        self.upper = vllm_is_truncated_threshold

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                rollout_log_probs=None):
        loss, s1, s2 = self._ppo(log_probs, old_log_probs, advantages)
        if self.on:
            loss = (old_log_probs - rollout_log_probs).exp().clamp(max=self.upper) * loss
        return _masked_mean(loss, action_mask), _masked_mean((s2 < s1).float(), action_mask), \
            None, None


class LossTyped:                         # 0.9.3-0.11.1: vllm_is_correction_type
    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                 policy_loss_type="ppo", enable_vllm_is_correction=False,
                 vllm_is_truncated_threshold=None, vllm_is_correction_type="tis"):
        if vllm_is_correction_type not in {"tis", "icepop", "seq-mask-tis"}:
            raise ValueError("must be one of tis/icepop/seq-mask-tis")

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                rollout_log_probs=None, dp_size=1, batch_num_tokens=None,
                global_batch_size=None):
        raise NotImplementedError


for cls in (Loss085, Loss092, Loss0910, LossTyped):
    cls.__module__ = __name__            # owner_class reads the class from the method's globals


def _row(label):
    return next(r for r in orl.ROWS if r.label == label)


@pytest.mark.parametrize("cls, label, verdict", [
    (Loss085, "is_correction token clip", card.NotInVersion),  # no rollout_log_probs at all
    (Loss0910, "is_correction token mask", card.NotInVersion),  # truncation only
    (Loss0910, "is_correction seq mask", card.NotInVersion),
    (Loss092, "is_correction seq mask", card.NotInVersion),    # token level only
    (Loss085, "gspo", card.NotInVersion),                      # no policy_loss_type
    (Loss085, "ppo, 0.2/0.28, dual clip 3", card.NotInVersion),
    (Loss085, "ppo_kl", card.NotInVersion),                    # returns (loss, clip_ratio)
])
def test_a_mode_an_openrlhf_release_lacks_is_not_in_this_version(cls, label, verdict):
    with pytest.raises(verdict):
        _row(label).fits(cls.forward)


def test_each_openrlhf_correction_form_gets_its_own_keywords():
    keywords, conventions, choice = orl._is_form(Loss092.forward, "token", "mask")
    assert keywords["use_icepop"] is True and conventions == {} and "0.9.2" in choice
    keywords, conventions, choice = orl._is_form(Loss0910.forward, "token", "clip")
    assert keywords["vllm_is_truncated_threshold"] == 5.0 and conventions == dict(lower=None)
    keywords, _, choice = orl._is_form(LossTyped.forward, "seq", "mask")
    assert keywords["vllm_is_correction_type"] == "seq-mask-tis" and "0.9.3-0.11.1" in choice


@pytest.mark.parametrize("cls, level, mode", [(Loss092, "token", "mask"),
                                              (Loss092, "token", "clip"),
                                              (Loss0910, "token", "clip")])
def test_an_older_openrlhf_correction_gives_the_reference_weights(cls, level, mode):
    from ref_numpy import rollout_is_weights

    row = _row(f"is_correction {level} {mode}")
    fit = row.fits(cls.forward)
    adapter = row.adapt(cls.forward)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand((3, 4), generator=g, dtype=torch.float64) * 3
    rollout = logp + torch.randn((3, 4), generator=g, dtype=torch.float64)
    mask = torch.ones((3, 4), dtype=torch.bool)
    mask[1, 3] = mask[2, 2:] = False
    got = adapter(logp, rollout, mask)
    conventions = dict(row.conventions, **fit["conventions"])
    seq = {"token": "token", "sequence": "sequence"}[conventions.pop("level")]
    want = rollout_is_weights(logp.numpy(), rollout.numpy(), mask.numpy(), level=seq,
                              mode=conventions.pop("mode"), upper=5.0,
                              lower=conventions.get("lower", 0.5), kept="token")
    assert torch.allclose(got, torch.as_tensor(want), rtol=1e-12, atol=1e-12)


def test_an_openrlhf_policy_loss_without_counts_is_judged_as_its_trainer_accumulates():
    fit = _row("ppo").fits(Loss085.forward)
    # DeepSpeed averages the micro-batches' gradients; each is normalised by its own tokens
    assert fit["audit"] == dict(accumulation="mean")
    assert fit["conventions"] == dict(log_ratio_clamp=None)       # no ±20 clamp before 0.11
    assert "takes no global counts" in fit["choice"]
    adapter = _row("ppo").adapt(Loss085.forward)
    assert "n_tokens_global" not in inspect.signature(adapter).parameters


class _Maker:
    """compute_advantages_and_returns as an OpenRLHF release before 0.10.2 reads its config."""

    def compute_advantages_and_returns(self, experiences):
        n = self.strategy.args.n_samples_per_prompt
        return experiences, n


class _NestedMaker:
    """... and as 0.10.2 and later read it."""

    def compute_advantages_and_returns(self, experiences):
        n = self.strategy.args.rollout.n_samples_per_prompt
        return experiences, n


def test_an_openrlhf_release_before_0_10_2_is_adapted_to_its_flat_config_and_says_so():
    row = next(r for r in orl.TRAINER.rows if r.label == "group_norm")
    fit = row.fits(_Maker.compute_advantages_and_returns)
    assert fit["choice"].startswith("this release's flat strategy.args (before 0.10.2): "
                                    "n_samples_per_prompt")
    assert row.fits(_NestedMaker.compute_advantages_and_returns) == {}


def test_an_unknown_correction_interface_does_not_fit():
    class Odd(Loss085):
        def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                    rollout_log_probs=None):
            raise NotImplementedError
    Odd.__module__ = __name__
    globals()["Odd"] = Odd
    with pytest.raises(card.DoesNotFit, match="takes none of"):
        _row("is_correction token clip").fits(Odd.forward)


TRL_BEFORE_026 = '''
    class GRPOTrainer:
        def _generate_and_score_completions(self, inputs):
            old_per_token_logps = inputs["old"]
            if self.use_vllm and self.vllm_importance_sampling_correction:
                importance_sampling_ratio = torch.exp(
                    old_per_token_logps - sampling_per_token_logps)
                importance_sampling_ratio = torch.clamp(
                    importance_sampling_ratio, max=self.vllm_importance_sampling_cap
                )
            return importance_sampling_ratio
    '''
TRL_BEFORE_023 = '''
    class GRPOTrainer:
        def _generate_and_score_completions(self, inputs):
            old_per_token_logps = inputs["old"]
            return old_per_token_logps
    '''


def _trl_rows(tmp_path, text):
    path = tmp_path / "grpo_trainer.py"
    path.write_text(textwrap.dedent(text))
    return str(path), [r for r in trl_card.ROWS if r.block is not None]


def test_trl_before_0_26_runs_its_one_mode_block_for_token_truncation(tmp_path):
    path, rows = _trl_rows(tmp_path, TRL_BEFORE_026)
    truncate = next(r for r in rows if r.label == "token_truncate")
    with pytest.raises(blocks.BlockNotFound):
        blocks.compile_block(path, truncate.qualname, *truncate.block)
    (first, last, outputs), note = truncate.older_blocks[0]
    fn, lo, hi = blocks.compile_block(path, truncate.qualname, first, last, outputs)
    assert (lo, hi) == (6, 10) and "before 0.26" in note
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    rollout = torch.tensor([[-3.0, -1.5]], dtype=torch.float64)
    got = truncate.adapt(fn)(logp, rollout, torch.ones((1, 2), dtype=torch.bool))
    # exp(2) = 7.39 truncated at 3, exp(-0.5) kept
    assert torch.allclose(got, torch.tensor([[3.0, math.exp(-0.5)]], dtype=torch.float64))
    # the other modes have no older form: their block is absent in such a release
    mask_row = next(r for r in rows if r.label == "token_mask")
    assert mask_row.older_blocks == ()
    with pytest.raises(blocks.BlockNotFound) as err:
        blocks.compile_block(path, mask_row.qualname, *mask_row.block)
    assert err.value.absent


def test_a_block_whose_shape_changed_is_not_called_absent(tmp_path):
    path, rows = _trl_rows(tmp_path, TRL_BEFORE_023)
    with pytest.raises(blocks.BlockNotFound) as err:      # old_per_token_logps is assigned,
        blocks.compile_block(path, rows[0].qualname,         # but nothing after it matches
                             "old_per_token_logps", "no_such_output", ("x",))
    assert not err.value.absent


def test_a_verl_policy_loss_of_0_6_0_returns_four_values_and_is_read_as_such():
    from crosscheck.trainer import verl as verl_card
    loss, metrics = verl_card._loss_and_metrics((1.0, 0.1, 0.2, 0.3))
    assert loss == 1.0 and metrics == {"actor/pg_clipfrac": 0.1, "actor/ppo_kl": 0.2,
                                       "actor/pg_clipfrac_lower": 0.3}
    assert verl_card._loss_and_metrics((1.0, {"a": 1})) == (1.0, {"a": 1})
    with pytest.raises(card.DoesNotFit, match="returned 3 values"):
        verl_card._loss_and_metrics((1.0, 2.0, 3.0))


def test_verl_before_0_7_is_judged_under_the_actors_mean_accumulation():
    from crosscheck.trainer import verl as verl_card

    def agg_loss(loss_mat, loss_mask, loss_agg_mode):          # 0.6: no global counts
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    fit = verl_card._counts_as_coded(agg_loss)
    assert fit["audit"] == dict(accumulation="mean") and "0.7.0" in fit["choice"]

    def agg_loss_07(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None,  # noqa: ARG001
                    global_batch_size=None):
        return loss_mat.sum() / batch_num_tokens
    agg_loss_07.__name__ = "agg_loss"
    assert verl_card._counts_as_coded(agg_loss_07) == {}
    row = next(r for r in verl_card.ROWS if r.qualname == "agg_loss" and r.label == "token-mean")
    adapter = row.adapt(agg_loss)
    assert list(inspect.signature(adapter).parameters) == ["loss", "mask"]


def test_verl_icepop_rows_are_not_in_a_release_with_a_float_threshold_only():
    from crosscheck.trainer import verl as verl_card

    def compute_rollout_correction_weights(log_ratio, response_mask, rollout_is="token",
                                           rollout_is_threshold=2.0):
        return log_ratio.exp().clamp(max=rollout_is_threshold), {}
    row = next(r for r in verl_card.ROWS if r.label == "token IcePop mask")
    with pytest.raises(card.NotInVersion, match="no IcePop mask mode"):
        row.fits(compute_rollout_correction_weights)


def test_skyrl_rows_set_every_value_they_are_judged_at_and_refuse_older_forms():
    from crosscheck.trainer import skyrl as skyrl_card

    cispo = next(r for r in skyrl_card.ROWS if r.label == "cispo")
    # 0.2 and 0.3 default CISPO's bounds to 0.0 / 5.0: the row sets 1.0 / 4.0 itself
    assert "set" in cispo.choices[-1]

    def reduce_loss(loss, loss_mask):                    # 0.1: no advantage scaling
        return (loss * loss_mask).sum()
    with pytest.raises(card.DoesNotFit, match="no apply_loss_reduction"):
        cispo.fits(reduce_loss)
    kl = next(r for r in skyrl_card.ROWS if r.label == "k3")
    with pytest.raises(card.DoesNotFit, match="torch.no_grad"):
        kl.fits(_no_grad_kl)


@torch.no_grad()
def _no_grad_kl(log_probs, log_probs_base, loss_mask=None, kl_estimator_type="k3"):
    return log_probs - log_probs_base


def test_a_row_whose_mode_the_release_lacks_is_reported_not_in_this_version_with_why(tmp_path):
    (tmp_path / "lacking_xyz").mkdir()
    (tmp_path / "lacking_xyz" / "__init__.py").write_text("")
    (tmp_path / "lacking_xyz" / "norm.py").write_text("def whiten(x, mask):\n    return x\n")

    def fits(fn):
        raise card.NotInVersion("whiten has no shift_mean in this version")
    row = card.Row("lacking_xyz.norm:whiten", "whiten", lambda fn: fn, fits=fits,
                   params=("x", "mask"))
    trainer = card.Trainer(name="lacking_xyz", package="lacking_xyz", dist="lacking_xyz",
                           profile="verl", pinned="0", modules=("lacking_xyz.norm",),
                           rows=(row,), inventory=(), installable=False)
    c = card.run(trainer, path=str(tmp_path), cases=4)
    (r,) = c.rows
    assert (r.verdict, r.reason) == ("NOT IN THIS VERSION",
                                     "whiten has no shift_mean in this version")
    # the card's coverage line counts it in words
    assert "coverage: 0 of 1 functions (0 %) have a reference and ran; 0 not covered, 1 not " \
           "in this version" in c.text()


def test_a_checkout_reads_the_trainers_version_file(tmp_path):
    # verl keeps its version in verl/version/version; a copy outside git shows it on the card
    for rel in ("verl/trainer/ppo/core_algos.py", "verl/utils/torch_functional.py",
                "verl/trainer/ppo/rollout_corr_helper.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "verl/version").mkdir()
    (tmp_path / "verl/version/version").write_text("0.7.0\n")
    c = card.run(get("verl"), path=str(tmp_path), only=["no such row"])
    assert c.source.version == "not a git checkout (package version 0.7.0)"
    assert c.rows == []


def test_the_verl_fits_of_several_merge_their_keywords_and_join_their_choices():
    from crosscheck.trainer import verl
    fit = verl._fits_all(lambda fn: dict(choice="a", conventions=dict(x=1)),
                         lambda fn: None,
                         lambda fn: dict(choice="b", audit=dict(y=2), conventions=dict(z=3)))
    assert fit(None) == dict(choice="a; b", conventions=dict(x=1, z=3), audit=dict(y=2))


def test_a_function_whose_source_cannot_be_read_does_not_fit_and_is_named():
    fn = eval("lambda x: x")                  # no file behind it
    fn.__qualname__ = "made_at_run_time"
    with pytest.raises(card.DoesNotFit, match="the source of made_at_run_time cannot be read"):
        card.source_of(fn)
