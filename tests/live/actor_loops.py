"""Actor loops written the way verl's and OpenRLHF's actors call their loss functions (the
trainers themselves need GPUs): a mini-batch split into micro-batches, global counts passed to
each call, one backward per micro-batch, the optimizer step after the last. The policy is a
table of logits (one leaf parameter) so the log-probs are a real function of parameters.

`bug` plants what the issue's trackers record: "twice" divides each micro-batch's loss by the
number of micro-batches although the global counts already normalise it (the accumulation
division done twice); "local" passes the micro-batch's own token count as the global one.
"""
import numpy as np
import torch

V = 7


class ActorConfig:
    """The fields of verl's ActorConfig the policy loss reads."""

    def __init__(self, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0):
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high = (clip_ratio, clip_ratio_low,
                                                                      clip_ratio_high)
        self._c = clip_ratio_c
        self.global_batch_info = {}

    def get(self, key, default=None):
        return self._c if key == "clip_ratio_c" else default


def mini_batch(seed=0, B=8, T=6):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=B)
    mask = torch.tensor(np.arange(T)[None] < lengths[:, None])
    tokens = torch.tensor(rng.integers(0, V, size=(B, T)))
    old = torch.tensor(rng.normal(-2.0, 0.3, size=(B, T)))
    adv = torch.tensor(rng.normal(size=(B, 1))).expand(B, T).contiguous()
    return dict(mask=mask, tokens=tokens, old=old, adv=adv)


def policy(B=8, T=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(B, T, V, generator=g, dtype=torch.float64) * 0.3)


def log_probs(logits, tokens):
    return torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]


def verl_step(core_algos, mode="token-mean", micro=4, bug=None, seed=0, kl=False, rec=None):
    """One verl-style optimizer step of PPO ('vanilla') over a mini-batch of 8 rows."""
    data = mini_batch(seed)
    logits = policy()
    config = ActorConfig()
    mask = data["mask"]
    fn = core_algos.get_policy_loss_fn("vanilla")
    n = len(range(0, 8, micro))
    for start in range(0, 8, micro):
        rows = slice(start, start + micro)
        m = mask[rows]
        local = bug == "local"
        config.global_batch_info = dict(
            dp_size=1, batch_num_tokens=int((m if local else mask).sum()),
            global_batch_size=int((m if local else mask).any(-1).sum()), loss_scale_factor=None)
        lp = log_probs(logits, data["tokens"])[rows]
        loss, _ = fn(data["old"][rows], lp, data["adv"][rows], m, mode, config)
        if kl:
            ref = data["old"][rows]
            loss = loss + 0.1 * core_algos.agg_loss(
                core_algos.kl_penalty(lp, ref, "low_var_kl"), m, mode,
                **config.global_batch_info)
        if bug == "twice":
            loss = loss / n
        loss.backward()
    if rec is not None:
        rec.step()                         # the optimizer steps here
    return logits.grad


def openrlhf_step(loss_module, token_level=True, micro=4, bug=None, seed=0, rec=None,
                  dual_clip=None):
    """One OpenRLHF-style step: PolicyLoss built by the actor, global counts passed per call."""
    data = mini_batch(seed)
    logits = policy()
    mask = data["mask"]
    actor_loss = loss_module.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28,
                                        token_level_loss=token_level, dual_clip=dual_clip)
    n = len(range(0, 8, micro))
    for start in range(0, 8, micro):
        rows = slice(start, start + micro)
        m = mask[rows]
        lp = log_probs(logits, data["tokens"])[rows]
        local = m if bug == "local" else mask
        loss = actor_loss(lp, data["old"][rows], data["adv"][rows], action_mask=m, dp_size=1,
                          batch_num_tokens=int(local.sum()),
                          global_batch_size=int(local.any(-1).sum()))[0]
        if bug == "twice":
            loss = loss / n
        loss.backward()
    if rec is not None:
        rec.step()
    return logits.grad
