"""Provenance of the loss's inputs in a TRL GRPO run: each input the loss receives is checked
against what the run produced for it (trl/trainer/grpo_trainer.py, read at TRL 1.16.0).

A completion is identified by its content, never its position (TRL shuffles the generation batch
and slices it into `steps_per_generation` micro-batches): a key is a hash of the row's prompt
ids under its prompt mask and its completion ids, padding included (every slice of one
generation keeps the generation's padded width). Identical completions of one prompt share a key
and are counted as a multiset.

- rows: at every micro-step, sampled or not, the rows of the loss are hashed (B small hashes).
  The micro-steps of one generation run in passes of `steps_per_generation`; each pass uses
  every row of the generation exactly once, and TRL regenerates after `num_iterations` passes.
  A row used twice in a pass, a row of no live generation, a pass that misses rows, or a
  generation replaced before its passes ran (or reused beyond them) is a deviation, reported at
  the next sampled step (with the micro-step it happened at).
- row advantages: the advantage a row carries into the loss is the one
  _generate_and_score_completions returned for that completion.
- mask: the completion mask ends at the first end-of-sequence token (`trainer.eos_token_ids`),
  zeros after it, and zeros a row whose last token is neither an end nor padding where
  `mask_truncated_completions` is on; `num_items_in_batch` is the generation's loss-mask count
  on every process (the `global counts` check).
- old log-probs: where TRL computes them (steps_per_generation · num_iterations not dividing
  the accumulation steps, or vLLM's importance sampling), at a micro-step with no optimizer step
  since its generation they are the current policy's log-probs to precision (ratio 1).
- reference log-probs (β > 0): at step 1 they equal the current log-probs (KL 0); at every
  sampled step the reference model shares no parameter with the policy and its parameters are
  unchanged since the audit began (a float64 checksum); after step 1 one row's reference
  log-probs are recomputed with the reference model (one forward without gradient).
- temperature: the sampler's temperature (generation_config or vLLM's) is the configured one,
  and one row's log-probs in the loss are log-softmax(logits ÷ temperature) of the policy's own
  logits (one forward without gradient, at the first micro-batch of a sampled step).
- reward weights: where the advantages do not match Σ w·r, whether Σ w²·r or Σ r does
  (weights applied twice, or not at all).

The extra forwards run on one row each, without gradient, at sampled steps only, and not where
dropout is active (a second forward would draw different masks, and random numbers).
"""
import collections
import hashlib
from typing import Dict, List, Optional

import numpy as np
import torch

import ref_numpy

from .. import bridge, tolerances
from .report import Finding

G = "trl/trainer/grpo_trainer.py::_generate_and_score_completions"
P = "trl/trainer/grpo_trainer.py::_prepare_inputs"
C = "trl/trainer/grpo_trainer.py::_compute_loss"
CHECKS = ("reward weights", "rows", "row advantages", "mask", "global counts",
          "old log-probs", "reference log-probs", "temperature")
WORDS = {
    "rows": "each completion, identified by a hash of its prompt and completion ids, reaches "
            "the loss once in every pass of steps_per_generation micro-steps over its "
            "generation, for num_iterations passes, and no row of another generation does "
            "(every micro-step is hashed, sampled or not)",
    "row advantages": "the advantage each row carries into the loss, against the one "
                      "_generate_and_score_completions returned for that completion",
    "mask": "the completion mask the loss receives, against the one its completion ids imply: "
            "through the first end-of-sequence token, zero after it, and zero for a truncated "
            "row where mask_truncated_completions is on",
    "global counts": "num_items_in_batch, against the loss-mask count of the micro-batch's "
                     "generation on every process",
    "old log-probs": "old_per_token_logps at a micro-step with no optimizer step since its "
                     "generation, against the log-probs the loss received (ratio 1)",
    "reference log-probs": "ref_per_token_logps against the log-probs the loss received at "
                           "step 1 (KL 0); the reference model shares no parameter with the "
                           "policy and is unchanged since the audit began (a checksum); after "
                           "step 1, one row's, against the reference model's own forward",
    "temperature": "the sampler's temperature against GRPOConfig.temperature, and one row's "
                   "log-probs in the loss against log-softmax(the policy's logits ÷ "
                   "temperature) (one forward without gradient per sampled step)",
    "reward weights": "where the advantages do not match Σ reward_weights·rewards_per_func, "
                      "whether the weights applied twice or not at all do",
}
TRUSTED = (
    "the rewards, as your reward functions returned them (their weighting and sum are "
    "checked)",
    "the completions and the sampler's truncation of the distribution (top_p, top_k, min_p, "
    "repetition_penalty): the loss scores the untruncated distribution at the temperature",
    "the log-probs the loss received outside the one row per sampled step recomputed from the "
    "policy's logits",
)
OLD_OMITTED = ("TRL omits old_per_token_logps (steps_per_generation · num_iterations divides "
               "the accumulation steps): the loss takes the detached log-probs, ratio 1 by "
               "construction")


def row_keys(prompt_ids, prompt_mask, completion_ids) -> List[bytes]:
    """One key per row: a hash of the prompt ids under the prompt mask and the completion ids,
    padding included."""
    p = prompt_ids.detach().cpu().numpy()
    pm = prompt_mask.detach().cpu().numpy() != 0
    c = completion_ids.detach().cpu().numpy()
    out = []
    for i in range(c.shape[0]):
        h = hashlib.blake2b(digest_size=16)
        h.update(p[i][pm[i]].astype(np.int64).tobytes())
        h.update(b"|")
        h.update(c[i].astype(np.int64).tobytes())
        out.append(h.digest())
    return out


def expected_mask(ids: np.ndarray, ends, pad: Optional[int], max_len: int,
                  truncated_off: bool) -> np.ndarray:
    """The completion mask TRL's generation implies for completion ids [B, T]: ones through the
    first end token; a row without one keeps its max_completion_length tokens (the sampler ran
    to the limit), all zero where mask_truncated_completions is on and its last token is
    neither an end token nor padding (_generate_and_score_completions' is_truncated)."""
    B, T = ids.shape
    is_end = np.isin(ids, np.asarray(list(ends), dtype=ids.dtype))
    mask = np.zeros((B, T), dtype=bool)
    stop = [*ends] + ([] if pad is None else [pad])
    for i in range(B):
        hit = np.flatnonzero(is_end[i])
        n = int(hit[0]) + 1 if hit.size else min(T, int(max_len))
        if truncated_off and n > 0 and int(ids[i, n - 1]) not in stop:
            n = 0
        mask[i, :n] = True
    return mask


def _checksum(module) -> Optional[tuple]:
    if module is None:
        return None
    total = None
    with torch.no_grad():
        for p in module.parameters():
            x = p.detach().to(torch.float64)
            part = torch.stack([x.sum(), x.abs().sum()])
            total = part if total is None else total + part.to(total.device)
    return None if total is None else tuple(float(v) for v in total.tolist())


def _dropout_active(model) -> bool:
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training
               for m in model.modules())


class Generation:
    def __init__(self, serial, step, global_step, keys, adv, loss_mask_total):
        self.serial, self.step, self.global_step = serial, step, global_step
        self.keys = keys
        self.mult = collections.Counter(keys)
        self.adv: Dict[bytes, list] = collections.defaultdict(list)
        for k, a in zip(keys, adv):
            self.adv[k].append(a)
        self.total = loss_mask_total
        self.uses = 0                                  # micro-steps since the generation
        self.counts: collections.Counter = collections.Counter()   # this pass's uses


class Provenance:
    """One process's provenance records; `payload()` travels in the step's gather, and rank 0's
    `check()` turns every rank's into counts and findings."""
    G, P, C = G, P, C                       # the trainer's code each finding cites
    LOGPS = C + ": the fused LM head's temperature"
    SAMPLER = "GRPOTrainer.__init__: generation_config"

    def __init__(self, trainer, rank: int):
        t, a = trainer, trainer.args
        self.t, self.rank = t, rank
        self.spg, self.ni = int(a.steps_per_generation), int(a.num_iterations)
        self.ga = int(a.gradient_accumulation_steps)
        self.tau = float(a.temperature)
        self.beta = float(a.beta)
        self.gen: Optional[Generation] = None
        self._serial = 0
        self._micro = 0                                # micro-steps seen
        self._rows_n = 0
        self._events: List[Finding] = []
        self._local: List[tuple] = []                  # (check, n, fails, rel, findings)
        self._mbs: List[tuple] = []                    # (serial, num_items_in_batch, mb index)
        self._totals: Dict[int, float] = {}
        self._forwarded = False
        self._ref_sum = _checksum(getattr(t, "ref_model", None))
        self.not_applicable: Dict[str, str] = {}
        self.mask_why = None
        if getattr(t, "tools", None) or getattr(t, "rollout_func", None) is not None or \
                getattr(t, "environment_factories", None) is not None:
            self.mask_why = ("tools, an environment or a rollout_func: a completion holds several "
                             "turns, so its mask is not cut at the first end token")
            self.not_applicable["mask"] = self.mask_why
        self.old_given = bool(self.ga % (self.spg * self.ni) != 0 or
                              (a.use_vllm and a.vllm_importance_sampling_correction))
        if not self.old_given:
            self.not_applicable["old log-probs"] = OLD_OMITTED
        if not self.beta:
            self.not_applicable["reference log-probs"] = "β = 0: no reference term"
        self.step = 0

    # ------------------------------------------------------------------ every micro-step
    def generated(self, out):
        """A generation: its rows' keys, advantages and loss-mask count (on this process)."""
        keys = row_keys(out["prompt_ids"], out["prompt_mask"], out["completion_ids"])
        adv = bridge.to_numpy(out["advantages"])
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        self.new_generation(keys, list(adv), float(mask.sum().item()))

    def new_generation(self, keys, adv, total):
        """A generation's rows (keys), their advantages and its loss-mask count here."""
        prev = self.gen
        if prev is not None and prev.uses < self.spg * self.ni:
            self._event(f"a new generation replaced the previous one after {prev.uses} "
                        f"micro-step(s); steps_per_generation · num_iterations = "
                        f"{self.spg * self.ni}: its rows reached the loss "
                        f"{prev.uses // self.spg} full time(s), not {self.ni}", self.P,
                        got=prev.uses, expected=self.spg * self.ni)
        self._serial += 1
        gs = int(self.t.state.global_step)
        self.gen = Generation(self._serial, gs + 1, gs, keys, adv, total)

    def used(self, inputs) -> Optional[List[bytes]]:
        """A micro-step's rows: each a row of the live generation, at most its multiplicity
        in this pass; a finished pass used every row."""
        return self.use_keys(row_keys(inputs["prompt_ids"], inputs["prompt_mask"],
                                      inputs["completion_ids"]))

    def use_keys(self, keys: List[bytes]) -> List[bytes]:
        """`used` on the rows' keys."""
        self._micro += 1
        g = self.gen
        self._rows_n += len(keys)
        if g is None:
            self._event("rows reached the loss before any generation", self.P)
            return keys
        if g.uses >= self.spg * self.ni:
            self._event(f"rows of a generation reached the loss in pass {g.uses // self.spg + 1}"
                        f"; num_iterations = {self.ni}: the trainer did not regenerate on "
                        f"schedule", self.P,
                        got=g.uses // self.spg + 1, expected=self.ni)
        foreign = sum(1 for k in keys if k not in g.mult)
        if foreign:
            self._event(f"{foreign} of {len(keys)} rows are of no live generation (a stale or "
                        f"foreign batch)", self.P)
        twice = 0
        for k in keys:
            if k in g.mult:
                g.counts[k] += 1
                twice += g.counts[k] > g.mult[k]
        if twice:
            self._event(f"{twice} row(s) reached the loss a second time in pass "
                        f"{g.uses // self.spg + 1} over the generation (a slice used twice)",
                        self.P,
                        got=twice, expected=0)
        g.uses += 1
        if g.uses % self.spg == 0:
            missing = sum(max(m - g.counts[k], 0) for k, m in g.mult.items())
            if missing:
                self._event(f"pass {g.uses // self.spg} over the generation ended with "
                            f"{missing} of {len(g.keys)} rows never in the loss (a slice "
                            f"skipped)", self.P, got=missing, expected=0)
            g.counts = collections.Counter()
        return keys

    def _event(self, text, source, got=None, expected=None):
        self._events.append(Finding(
            self.step, "rows", "deviation", f"micro-step {self._micro}: {text}", rank=self.rank,
            got=None if got is None else float(got),
            expected=None if expected is None else float(expected), source=source))

    # ------------------------------------------------------------------ sampled micro-batches
    def micro_batch(self, model, inputs, keys, logp, index, dtype):
        """The per-row checks of one recorded micro-batch (this process)."""
        g = self.gen
        tol = tolerances.get("forward", "float64" if dtype == "float64" else "float32")
        if g is not None:
            self._mbs.append((g.serial, float(inputs["num_items_in_batch"]), index))
            self._totals[g.serial] = g.total
        self._row_advantages(inputs, keys, g, index)
        self._mask(inputs, index)
        self._old(inputs, logp, g, index, tol)
        self._ref(model, inputs, logp, index, tol)
        if not self._forwarded:
            self._forwarded = True
            self._temperature(model, inputs, logp, index, tol)

    def _add(self, check, n, fails, rel=0.0, finding=None):
        self._local.append((check, n, fails, rel, [finding] if finding else []))

    def _skip(self, check, why):
        self._local.append((check, 0, 0, 0.0, why))

    def _row_advantages(self, inputs, keys, g, index):
        if g is None:
            return
        got = bridge.to_numpy(inputs["advantages"])
        tol = tolerances.get("audit", "float32")
        bad, n, first = 0, 0, None
        for i, k in enumerate(keys):
            if k not in g.adv:
                continue
            n += 1
            if not any(bridge.compare(got[i], c, tol).ok for c in g.adv[k]):
                bad += 1
                if first is None:
                    first = (i, float(np.ravel(got[i])[0]), float(np.ravel(g.adv[k][0])[0]))
        f = None
        if bad:
            i, x, y = first
            f = Finding(self.step, "row advantages", "deviation",
                        f"{bad} of {n} rows carry an advantage other than the one computed for "
                        f"their completion at generation (the advantages are misaligned with "
                        f"the rows)", rank=self.rank, micro_batch=index, token=(i,), got=x,
                        expected=y, source=self.G + " → " + self.P)
        self._add("row advantages", n, bad, finding=f)

    def _mask(self, inputs, index):
        if self.mask_why:
            return
        t, a = self.t, self.t.args
        ids = inputs["completion_ids"].detach().cpu().numpy()
        got = inputs["completion_mask"].detach().cpu().numpy() != 0
        tok = getattr(t, "_tokenizer", None) or getattr(t, "processing_class", None)
        pad = getattr(tok, "pad_token_id", None)
        exp = expected_mask(ids, t.eos_token_ids, pad, a.max_completion_length,
                            bool(a.mask_truncated_completions))
        rows = np.flatnonzero((got != exp).any(axis=1))
        f = None
        if rows.size:
            i = int(rows[0])
            n_got, n_exp = int(got[i].sum()), int(exp[i].sum())
            if n_exp == 0 and n_got:
                why = "a truncated row is counted although mask_truncated_completions is on"
            elif n_got == 0 and n_exp:
                why = "a row is masked out entirely although it ends with an end token"
            elif n_got > n_exp:
                why = (f"the mask runs {n_got - n_exp} token(s) past the first end-of-sequence "
                       f"token")
            else:
                why = f"the mask stops {n_exp - n_got} token(s) before the first end token"
            f = Finding(self.step, "mask", "deviation",
                        f"{rows.size} of {len(got)} rows' completion mask is not the one their "
                        f"completion ids imply: {why} (row {i}: {n_got} tokens counted, "
                        f"{n_exp} expected)", rank=self.rank, micro_batch=index, token=(i,),
                        got=float(n_got), expected=float(n_exp),
                        source=self.G + ": completion_mask (first EOS; "
                                        "mask_truncated_completions)")
        self._add("mask", len(got), int(rows.size), finding=f)

    def _close(self, got, exp, mask, tol):
        got = np.where(mask, got, 0.0)
        exp = np.where(mask, exp, 0.0)
        c = bridge.compare(got, exp, tol)
        bad = int((~bridge.within(got, exp, tol)).sum()) if not c.ok else 0
        return c, bad

    def _old(self, inputs, logp, g, index, tol):
        if not self.old_given:
            return
        old = inputs.get("old_per_token_logps")
        if old is None:
            self._skip("old log-probs", "the loss received no old_per_token_logps")
            return
        if g is None or g.global_step != int(self.t.state.global_step):
            self._skip("old log-probs", "an optimizer step since the generation: old and "
                       "current log-probs differ by design (checked in the first window after "
                       "each generation)")
            return
        mask = bridge.to_numpy(inputs["completion_mask"]) != 0
        c, bad = self._close(logp, bridge.to_numpy(old), mask, tol)
        f = None if c.ok else Finding(
            self.step, "old log-probs", "deviation",
            f"old_per_token_logps differ from the log-probs the loss received at {bad} "
            f"token(s), with no optimizer step since the generation: they are not the sampling "
            f"policy's (ratio ≠ 1 before any update)", rank=self.rank, micro_batch=index,
            token=c.index, got=c.expected, expected=c.got,
            source=self.G + ": old_per_token_logps")
        self._add("old log-probs", int(mask.sum()), bad, c.max_rel, f)

    def _ref(self, model, inputs, logp, index, tol):
        if not self.beta:
            return
        ref = inputs.get("ref_per_token_logps")
        if ref is None:
            self._skip("reference log-probs", "the loss received no ref_per_token_logps")
            return
        ref = bridge.to_numpy(ref)
        mask = bridge.to_numpy(inputs["completion_mask"]) != 0
        if int(self.t.state.global_step) == 0:
            c, bad = self._close(logp, ref, mask, tol)
            f = None if c.ok else Finding(
                self.step, "reference log-probs", "deviation",
                f"at step 1, where the policy is the reference, ref_per_token_logps differ "
                f"from the log-probs the loss received at {bad} token(s) (KL ≠ 0): not the "
                f"reference model's", rank=self.rank, micro_batch=index, token=c.index,
                got=c.expected, expected=c.got, source=self.G + ": ref_per_token_logps")
            self._add("reference log-probs", int(mask.sum()), bad, c.max_rel, f)
            return
        rm = getattr(self.t, "ref_model", None)
        if rm is None or self._forwarded or _dropout_active(rm):
            return
        row = _row(mask)
        if row is None:
            return
        z, y = self._row_logits(rm, inputs, row)
        own = _logps_at(z, y, self.tau)
        m = mask[row:row + 1]
        c, bad = self._close(ref[row:row + 1], own, m, tol)
        f = None if c.ok else Finding(
            self.step, "reference log-probs", "deviation",
            f"row {row}'s ref_per_token_logps differ from the reference model's own log-probs "
            f"at {bad} token(s): they were not computed with the reference model (the "
            f"policy's, or another model's)", rank=self.rank, micro_batch=index,
            token=(row, c.index[1]) if c.index else None, got=c.got, expected=c.expected,
            source=self.G + ": ref_per_token_logps")
        self._add("reference log-probs", int(m.sum()), bad, c.max_rel, f)

    def _temperature(self, model, inputs, logp, index, tol):
        t = self.t
        sampler = self._sampler_temperature()
        if sampler is not None:
            ok = float(sampler) == self.tau
            f = None if ok else Finding(
                self.step, "temperature", "deviation",
                f"the sampler draws at temperature {sampler!r} but GRPOConfig.temperature is "
                f"{self.tau!r}, which divides the logits in the loss: the log-probs are not "
                f"the sampling distribution's", rank=self.rank, got=float(sampler),
                expected=self.tau, source=self.SAMPLER)
            self._add("temperature", 1, 0 if ok else 1, finding=f)
        policy = t.accelerator.unwrap_model(model)
        if _dropout_active(policy):
            self._skip("temperature", "dropout is active: a second forward draws other masks")
            return
        mask = bridge.to_numpy(inputs["completion_mask"]) != 0
        row = _row(mask)
        if row is None:
            return
        z, y = self._row_logits(policy, inputs, row)
        m = mask[row:row + 1]
        got = logp[row:row + 1]
        c, bad = self._close(got, _logps_at(z, y, self.tau), m, tol)
        f = None
        if not c.ok:
            cands = sorted({1.0, float(sampler) if sampler is not None else 1.0} - {self.tau})
            at = [tau for tau in cands if self._close(got, _logps_at(z, y, tau), m, tol)[0].ok]
            why = (f"they are the policy's log-probs at temperature {at[0]!r}, not at the "
                   f"configured {self.tau!r} the sampler draws at" if at else
                   f"they are not log-softmax(the policy's logits ÷ {self.tau!r})")
            f = Finding(self.step, "temperature", "deviation",
                        f"row {row}'s log-probs in the loss differ from the policy's own at "
                        f"{bad} token(s): {why}", rank=self.rank, micro_batch=index,
                        token=(row, c.index[1]) if c.index else None, got=c.got,
                        expected=c.expected,
                        source=self.LOGPS)
        self._add("temperature", int(m.sum()), bad, c.max_rel, f)

    def _row_logits(self, model, inputs, row):
        """(the logits [1, T, V] that score row `row`'s completion tokens, those tokens [T]),
        from `model`'s own forward without gradient."""
        return _logits(self.t, model, inputs, row), inputs["completion_ids"][row]

    def _sampler_temperature(self):
        return _sampling_temperature(self.t)

    # ------------------------------------------------------------------ the window
    def window_checks(self):
        """Once per sampled window: the reference model is separate and frozen."""
        rm = getattr(self.t, "ref_model", None)
        if not self.beta or rm is None:
            return
        policy = set(p.data_ptr() for p in self.t.model.parameters())
        shared = sum(1 for p in rm.parameters() if p.data_ptr() in policy)
        now = _checksum(rm)
        bad = []
        if rm is self.t.accelerator.unwrap_model(self.t.model) or shared:
            bad.append(f"the reference model shares {shared} parameter tensor(s) with the "
                       f"policy: it trains with it")
        if now != self._ref_sum:
            bad.append(f"the reference model's parameters changed since the audit began "
                       f"(checksum Σp, Σ|p| {self._ref_sum} → {now}): it is not frozen")
        f = None if not bad else Finding(
            self.step, "reference log-probs", "deviation", "; ".join(bad), rank=self.rank,
            source="GRPOTrainer.__init__: ref_model")
        self._add("reference log-probs", 1, 1 if bad else 0, finding=f)

    def payload(self) -> dict:
        self.window_checks()
        out = dict(local=self._local, events=self._events, rows=self._rows_n, mbs=self._mbs,
                   totals=self._totals)
        self._local, self._events, self._rows_n, self._mbs = [], [], 0, []
        self._totals, self._forwarded = {}, False
        return out

    def begin(self, step: int):
        self.step = step


def _row(mask) -> Optional[int]:
    rows = np.flatnonzero(mask.any(axis=1))
    return int(rows[0]) if rows.size else None


def _logits(t, model, inputs, row):
    """The logits that score row `row`'s completion tokens, from `model`'s own forward (no
    fused head, no gradient): [1, T, V]."""
    pi, pm = inputs["prompt_ids"][row:row + 1], inputs["prompt_mask"][row:row + 1]
    ci, cm = inputs["completion_ids"][row:row + 1], inputs["completion_mask"][row:row + 1]
    T = ci.size(1)
    with torch.no_grad(), t.accelerator.autocast():
        out = model(input_ids=torch.cat([pi, ci], 1), attention_mask=torch.cat([pm, cm], 1),
                    logits_to_keep=T + 1)
    return out.logits[:, :T].detach()


def _logps_at(z, ids, tau) -> np.ndarray:
    lp = torch.log_softmax(z.to(torch.float64) / tau, dim=-1)
    return lp.gather(-1, ids.view(1, -1, 1).to(lp.device)).squeeze(-1).cpu().numpy()


def _sampling_temperature(t):
    vg = getattr(t, "vllm_generation", None)
    if getattr(t, "use_vllm", False) and vg is not None:
        return getattr(vg, "temperature", None)
    gc = getattr(t, "generation_config", None)
    return None if gc is None else getattr(gc, "temperature", None)


def merge(res, gathered, world, source=G) -> None:
    """Rank 0: every process's provenance records into the step's result."""
    for p in gathered:
        q = p.get("prov")
        if q is None:
            continue
        res.count("rows", q["rows"], len(q["events"]))
        res.findings.extend(q["events"])
        for check, n, fails, rel, extra in q["local"]:
            if isinstance(extra, str):
                if check not in res.counts:
                    res.skipped.setdefault(check, extra)
                continue
            res.count(check, n, fails, rel)
            res.findings.extend(extra)
            res.skipped.pop(check, None)
    _global_counts(res, [p.get("prov") for p in gathered], source)


def _global_counts(res, provs, source=G):
    if any(q is None for q in provs):
        return
    totals: Dict[int, float] = collections.defaultdict(float)
    for q in provs:
        for serial, total in q["totals"].items():
            totals[serial] += total
    n = bad = 0
    for rank, q in enumerate(provs):
        for serial, given, index in q["mbs"]:
            n += 1
            if given != totals[serial]:
                bad += 1
                res.findings.append(Finding(
                    res.step, "global counts", "deviation",
                    f"num_items_in_batch is {given:g}, but the loss mask of its generation "
                    f"counts {totals[serial]:g} tokens on all {len(provs)} process(es)",
                    rank=rank, micro_batch=index, got=given, expected=totals[serial],
                    source=source + ": num_items_in_batch"))
    if n:
        res.count("global counts", n, bad)


def reward_weights(res, per_func, weights, got, at, conv, tol, rank, source=G) -> None:
    """Which weighting of rewards_per_func the advantages come from: Σ w·r (as configured),
    Σ w²·r (applied twice) or Σ r (not applied). Counted only where they are told apart."""
    valid = ~np.isnan(per_func).all(axis=1)

    def adv(power):
        with np.errstate(invalid="ignore"):
            r = np.nansum(per_func * (weights[None, :] ** power), axis=1)
        return ref_numpy.group_advantages(np.where(valid, r, np.nan), valid=valid, **conv)[at]
    want = adv(1)
    alts = {2: "applied twice (Σ w²·r)", 0: "not applied (Σ r)"}
    apart = {k: w for k, w in alts.items() if not bridge.compare(adv(k), want, tol).ok}
    if not apart:
        return
    if bridge.compare(got, want, tol, cond=8.0).ok:
        res.count("reward weights", got.size, 0)
        return
    for k, words in apart.items():
        c = bridge.compare(got, adv(k), tol, cond=8.0)
        if c.ok:
            res.count("reward weights", got.size, got.size)
            res.findings.append(Finding(
                res.step, "reward weights", "deviation",
                f"the advantages are formed from the rewards with reward_weights {words}, "
                f"not once: they match group_advantages of that sum", rank=rank,
                source=source + ": rewards_per_func × reward_weights"))
            return
