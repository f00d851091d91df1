"""The walkthrough's words, in English and Chinese. Numbers are never written here except the
seed's fixed hyper-parameters; every computed number arrives through a {placeholder}, and both
languages use the placeholders and fixed decimals in the same order."""

EN = {
    # ---------------------------------------------------------------- shared cells
    "@returns": "return_t", "@autograd": "autograd", "@dA0dr_hand": "∂A_0/∂r_t hand",
    "@dA0dV_hand": "∂A_0/∂V_t hand", "@dy0dx_hand": "∂y_0/∂A_i hand",
    "@closed_form": "(δ_0i − (1 + y_0·y_i)/N)/s", "@token": "token", "@objective": "min objective",
    "@binding": "clip binding", "@dldlogp_hand": "∂loss/∂logπ hand", "@why": "why",
    "@yes": "yes", "@no": "no", "@group": "group", "@rewards": "rewards", "@mean": "mean",
    "@std": "std (biased)", "@response": "response",
    "@ppo_clip": "PPO clip(r)", "@ppo_eff": "PPO effective r", "@ppo_grad": "PPO ∂/∂logπ",
    "@ppo_bind": "PPO binding", "@cispo_w": "CISPO w", "@cispo_grad": "CISPO ∂/∂logπ",
    "@cispo_bind": "CISPO binding", "@undetached": "if w not detached",
    "@estimator": "estimator", "@bias": "bias", "@used_as": "used as", "@samples": "samples",
    "@is_weight": "IS weight", "@expected_grad": "E[gradient] wrt logits", "@follows": "follows",
    "@use.loss": "loss", "@use.reward": "detached reward", "@samples.pi": "x ~ π",
    "@samples.uniform": "x ~ uniform", "@w.detached": "sg(π/μ)", "@w.attached": "π/μ attached",
    "@follows.zero": "0: no gradient at all", "@follows.forward": "∇KL(π‖ref)",
    "@follows.reverse": "∇KL(ref‖π)", "@follows.neither": "neither",
    "@why.pos_bind": "clip binding: A>0 and ratio > 1+ε, so no gradient",
    "@why.pos_low": "not binding: A>0 and ratio < 1−ε, min keeps r·A, gradient −A·r",
    "@why.inside": "inside [1−ε, 1+ε]: gradient −A·r",
    "@why.neg_bind": "clip binding: A<0 and ratio < 1−ε, so no gradient",
    "@why.neg_high": "not binding: A<0 and ratio > 1+ε, max keeps −r·A, gradient −A·r",
    "@why.dual_bind": "dual clip binding: A<0 and ratio > c, loss capped at −c·A, no gradient",
    # ---------------------------------------------------------------- 1 GAE
    "gae.title": "== 1. GAE: generalised advantage estimation ==",
    "gae.intro": "A trajectory of T={T} steps, γ={gamma}, λ={lam} (the seed's):\n"
                 "  rewards {r}\n  values  {v}\n  dones   {d} (the episode ends after the last "
                 "step: nothing is bootstrapped after it)",
    "gae.step1": "Step 1, TD errors δ_t = r_t + γ·V_(t+1)·(1 − done_t) − V_t (gae with λ = 0):",
    "gae.delta_line": "  δ_{t} = {r} + {g}·{vn}·{c} − {v} = {d}",
    "gae.step2": "Step 2, the backward recursion A_t = δ_t + γλ·A_(t+1), which unrolls to "
                 "A_t = Σ_l (γλ)^l·δ_(t+l):",
    "gae.adv_line": "  A_{t} = {terms} = {a}",
    "gae.returns": "returns = A + V, the critic's regression target: {ret}",
    "gae.grad_intro": "The gradient: how A_0 depends on every reward and every value (hand VJP "
                      "of gae with cotangent e_0, beside torch autograd):",
    "gae.why": "Why: ∂A_0/∂r_t = (γλ)^t, γλ = {gl}: reward t reaches A_0 through t decays. For "
               "t ≥ 1, ∂A_0/∂V_t = γ(γλ)^(t−1) − (γλ)^t = (γλ)^(t−1)·γ(1 − λ), γ(1 − λ) = "
               "{one_minus}: V_t is the bootstrap of δ_(t−1) (+γ) and the baseline of δ_t (−1). "
               "At λ = 1 the two cancel (Monte-Carlo: A_0 ignores later values); at λ = 0 only V_0 "
               "and V_1 matter.",
    # ---------------------------------------------------------------- 2 whitening
    "whiten.title": "== 2. Advantage whitening ==",
    "whiten.stats": "The advantages above, whitened over all tokens as MiniMind does (biased "
                    "variance, divided by sqrt(var + 1e-8)):\n  mean = {mean}, var = {var}, "
                    "std = {std}",
    "whiten.result": "  A_norm = (A − mean)/sqrt(var + 1e-8) = {y}",
    "whiten.check": "  check: mean(A_norm) = {m}, var(A_norm) = {v}",
    "whiten.grad_intro": "The gradient: whitening couples the tokens. ∂y_0/∂A_i, y = A_norm "
                         "(hand VJP with cotangent e_0, autograd, and the closed form):",
    "whiten.why": "Why: y = (x − μ)/s, and every x_i moves μ (−1/N each) and s (−y_0·y_i/N). The "
                  "column sums to {total}: adding a constant to every advantage changes nothing.",
    # ---------------------------------------------------------------- 3 PPO
    "ppo.title": "== 3. PPO clipped objective ==",
    "ppo.intro": "Four tokens, old log-prob −1, advantage A = +1, ε = 0.2, so the clip interval "
                 "is [0.8, 1.2] (the seed's). loss = −min(r·A, clip(r, 1−ε, 1+ε)·A):",
    "ppo.mean": "  mean loss over the tokens (token-mean) = {m}",
    "ppo.case_split": "The case split, which is the whole gradient: for A > 0, ∂loss/∂logπ = −A·r "
                      "until r > 1+ε, then 0; for A < 0, −A·r until r < 1−ε, then 0. "
                      "'clip binding' is exactly where that gradient is 0.",
    "ppo.corrections": "Corrections to the seed (found by computing):\n"
                       "  - Only token 0 is clipped. Tokens 2 and 3 have ratios {r2} and {r3}, "
                       "below 0.8, but with A > 0 the min keeps the smaller r·A, so the clip does "
                       "not bind and their gradients are {g2} and {g3}, not 0. (The seed's "
                       "'clipped' column tests clip(r) ≠ r, which is not the same thing.)\n"
                       "  - Token 2's ratio {r2} lies outside [0.8, 1.2]; the seed lists tokens 1 "
                       "and 2 as inside.\n"
                       "  - Token 3's ratio is {r3}, not 0.37.\n"
                       "  - The clip is not two-sided for any one token: the sign of A picks the "
                       "one edge that can bind.",
    "ppo.dual_intro": "Dual clip, for negative advantages (not in the seed): A = −1, c = 3. Without "
                      "it, a token with A < 0 and a large ratio has an unbounded loss −A·r; the "
                      "dual clip caps the loss at −c·A:",
    # ---------------------------------------------------------------- 4 GRPO
    "grpo.title": "== 4. GRPO group normalisation ==",
    "grpo.intro": "Two prompts with 4 responses each (the seed's rewards); A = (r − mean)/(std + "
                  "1e-4), biased std, as in MiniMind:",
    "grpo.adv": "  A = {a}\n  each group sums to zero: {s1}, {s2} (the group mean is the baseline)",
    "grpo.zero_loss": "The loss is 0 at ratio 1, its gradient is not (not in the seed). With logπ "
                      "= logπ_old every ratio is 1 and, aggregated seq-mean-token-mean, loss = "
                      "−(1/B)·Σ_i A_i = {v}. Yet every token of response i has ∂loss/∂logπ = "
                      "−A_i/(L_i·B) (responses of lengths L_i):",
    "grpo.zero_why": "Why: the value sums the centred advantages to zero, the gradient weights "
                     "each of them separately. Judge a trainer by its gradients, never by a zero "
                     "loss at the first step.",
    "grpo.weights_intro": "The per-token weight each aggregation mode gives a token of response "
                          "i (∂loss/∂l_it; not in the seed):",
    "grpo.weights_why": "Why: token-mean weighs every one of the N = {n} tokens alike; "
                        "seq-mean-token-mean gives a token 1/(L_i·B), so a short answer's tokens "
                        "weigh more (length bias); seq-mean-token-sum gives 1/B, so long answers "
                        "dominate; seq-mean-token-sum-norm, as this reference writes it (verl's "
                        "form before 0.9), gives the constant 1/T, here B = {B}, T = {T}. Dr. "
                        "GRPO and verl 0.9's mode of that name also divide by the B rows: "
                        "1/(B·T), seq-mean-token-sum with norm = T.",
    # ---------------------------------------------------------------- 5 CISPO
    "cispo.title": "== 5. CISPO vs PPO clip ==",
    "cispo.intro": "Ratios 0.3, 0.9, 1.5, 3.0, 5.0 with A = +1, logπ = −0.5; PPO with ε = 0.2, "
                   "CISPO with the absolute cap 2.0 (the seed's; MiniMind's default cap is 5.0). "
                   "CISPO's loss is −sg(w)·A·logπ with w = min(r, 2.0), the weight detached:",
    "cispo.why": "Why: PPO's gradient is −A·r where the unclipped branch is active and 0 where "
                 "the clip binds; CISPO's is −w·A at every token, clipped or not. The last "
                 "column is d(value)/d logπ, the gradient had w not been detached.",
    "cispo.corrections": "Corrections to the seed (found by computing):\n"
                         "  - At ratio 0.3 with A > 0, PPO does not lift the ratio to 0.8: the "
                         "min keeps 0.3, and the gradient is {g0}. PPO limits a decrease only "
                         "when A < 0.\n"
                         "  - CISPO does not stop a clipped token: at ratios 3.0 and 5.0 the "
                         "gradient is still {w3} and {w4} (the weight is capped, the update is "
                         "not), where PPO's gradient is 0 for 1.5, 3.0 and 5.0.\n"
                         "  - The seed's difference column subtracts PPO's clip(r) from CISPO's "
                         "weight; the ratios the two objectives actually use differ only above "
                         "1.2.",
    # ---------------------------------------------------------------- 6 KL
    "kl.title": "== 6. KL estimators k1, k2, k3 ==",
    "kl.intro": "Policy p = {p} and reference q = {q} (the seed's). At a sample x ~ p, with "
                "u = log(q(x)/p(x)): k1 = −u, k2 = u²/2, k3 = e^u − 1 − u:",
    "kl.per_sample_why": "∂k/∂logπ is 1 for k1, logπ − logq for k2 and 1 − q/p for k3 (hand VJP "
                         "of kl_penalty, equal to autograd).",
    "kl.moments_intro": "Exact moments under x ~ p (kl_estimator_moments, enumerating x): "
                        "KL(p‖q) = {kf}, KL(q‖p) = {kr}.",
    "kl.grad_intro": "What each estimator's gradient follows: the exact expected gradient wrt "
                     "the logits (kl_estimator_gradient), against ∇KL(π‖ref) = {fwd} and "
                     "∇KL(ref‖π) = {rev}:",
    "kl.corrections": "Corrections to the seed:\n"
                      "  - k3 is an unbiased estimate of the value KL(p‖q), but used as a loss "
                      "(MiniMind's PPO and GRPO do) its expected gradient is ∇KL(q‖p): it "
                      "optimises the reverse KL. To follow KL(p‖q), use k2 as a loss or k1 as a "
                      "detached reward; k1 as a loss gives no gradient at all.\n"
                      "  - 'k3 ≥ 0, so low variance' does not hold in general: for p = [0.99, "
                      "0.01] and q = [0.01, 0.99], Var k1 = {v1} but Var k3 = {v3}. k3's variance "
                      "is small only while p and q are close.\n"
                      "  - Samples from another policy need the weight π/μ; detached it restores "
                      "the on-policy gradient, attached it differentiates E_π[k] itself.",
    # ---------------------------------------------------------------- 7 compare
    "compare.title": "== 7. PPO vs GRPO ==",
    "@cmp.dimension": "dimension",
    "@cmp.critic": "critic", "@cmp.critic.ppo": "needed (value network V(s))",
    "@cmp.critic.grpo": "none",
    "@cmp.baseline": "baseline", "@cmp.baseline.ppo": "V(s_t), per token",
    "@cmp.baseline.grpo": "mean reward of the prompt's group",
    "@cmp.advantage": "advantage", "@cmp.advantage.ppo": "GAE Σ(γλ)^l·δ_(t+l)",
    "@cmp.advantage.grpo": "(r − group mean)/(group std + eps)",
    "@cmp.clip": "clipping", "@cmp.clip.ppo": "per token, the sign of A picks the edge that binds",
    "@cmp.clip.grpo": "the same clip, or CISPO (MiniMind's default, cap 5.0)",
    "@cmp.kl": "KL term", "@cmp.kl.ppo": "k3 as a loss term: follows ∇KL(ref‖π)",
    "@cmp.kl.grpo": "k3 per token (β = 0.1): follows ∇KL(ref‖π)",
    "@cmp.first_loss": "loss at step 1", "@cmp.first_loss.ppo": "−mean(A), whitened: ≈ 0",
    "@cmp.first_loss.grpo": "0 (centred groups); the gradient is not 0",
    "@cmp.early_stop": "early stop", "@cmp.early_stop.ppo":
        "MiniMind: approx-KL (k2) > 0.25 zeroes the loss; optimizer.step still runs",
    "@cmp.early_stop.grpo": "none",
    "@cmp.memory": "models in memory", "@cmp.memory.ppo": "actor + critic + reference",
    "@cmp.memory.grpo": "actor + reference",
    "compare.numbers": "The std convention matters: rewards [1, 0, 0, 0] give A_0 = {b} with "
                       "MiniMind's biased std and {u} with TRL's unbiased std.",
    # ---------------------------------------------------------------- 8 beyond PPO
    "beyond.title": "== 8. Beyond PPO: how each clip, gate or weight shapes the gradient ==",
    "beyond.intro": "One sequence of five tokens, logπ = −1, ratios r = π/π_old of 0.5, 0.9, 1.0, "
                    "1.3, 2.5. Each column is ∂loss/∂logπ per token (the hand VJP, confirmed by "
                    "autograd): PPO (ε = 0.2), CISPO (its weight clip(r, 0.8, 1.2), detached), "
                    "GSPO (the sequence ratio's geometric mean, ε = 0.2), SAPO (τ 1.0 / 1.05), "
                    "GMPO (ε = 0.2 in log space, per token, then the geometric mean), and the "
                    "rollout corrections of REINFORCE with π_old read as the rollout policy: TIS "
                    "(the weight min(r, 2), detached) and MIS (the weight r, 0 beyond 2). The "
                    "per-token methods' columns weigh each token 1 (a sum over tokens); GSPO's "
                    "and GMPO's are of their sequence loss, which takes the mean over the 5 "
                    "tokens, so they are on a scale 1/5 of the others: multiply them by 5 to "
                    "compare.",
    "beyond.pos": "A = +1:",
    "beyond.neg": "A = −1:",
    "beyond.why": "Why: PPO cuts a token's gradient to 0 once its ratio has left [1 − ε, 1 + ε] "
                  "in the advantage's direction (r = 1.3 and 2.5 for A > 0, r = 0.5 for A < 0). "
                  "CISPO never cuts: every token keeps −A times its clipped, detached weight. "
                  "GSPO and GMPO judge the whole sequence: each token gets one share of the "
                  "sequence's gradient (the mean over its 5 tokens), and GMPO's per-token clip "
                  "removes only the tokens past ±ε in the advantage's direction, as PPO's does. "
                  "SAPO fades instead of cutting: its gradient is −A·r·4σ(1 − σ), "
                  "σ = σ(τ(r − 1)); the weight 4σ(1 − σ) is 1 at r = 1 and decays with |r − 1| "
                  "at a speed set by τ (with τ = 1 the gradient still grows with r up to r ≈ 2.06, where it peaks at 1.575, and is falling by r = 2.5, at 1.491). TIS "
                  "keeps every token with its weight capped at 2; MIS drops the token whose weight "
                  "is past the bound. At r = 1 every per-token method gives −A, the on-policy "
                  "policy gradient.",
}

ZH = {
    "@returns": "回报 return_t", "@autograd": "autograd", "@dA0dr_hand": "∂A_0/∂r_t 手推",
    "@dA0dV_hand": "∂A_0/∂V_t 手推", "@dy0dx_hand": "∂y_0/∂A_i 手推",
    "@closed_form": "(δ_0i − (1 + y_0·y_i)/N)/s", "@token": "token", "@objective": "min 目标",
    "@binding": "裁剪生效", "@dldlogp_hand": "∂loss/∂logπ 手推", "@why": "原因",
    "@yes": "是", "@no": "否", "@group": "组", "@rewards": "奖励", "@mean": "均值",
    "@std": "标准差（有偏）", "@response": "回答",
    "@ppo_clip": "PPO clip(r)", "@ppo_eff": "PPO 有效 r", "@ppo_grad": "PPO ∂/∂logπ",
    "@ppo_bind": "PPO 裁剪生效", "@cispo_w": "CISPO w", "@cispo_grad": "CISPO ∂/∂logπ",
    "@cispo_bind": "CISPO 裁剪生效", "@undetached": "若 w 未 detach",
    "@estimator": "估计器", "@bias": "偏差", "@used_as": "用法", "@samples": "样本",
    "@is_weight": "重要性权重", "@expected_grad": "对 logits 的期望梯度", "@follows": "对应",
    "@use.loss": "作为 loss", "@use.reward": "作为 detach 奖励", "@samples.pi": "x ~ π",
    "@samples.uniform": "x ~ 均匀", "@w.detached": "sg(π/μ)", "@w.attached": "π/μ 不 detach",
    "@follows.zero": "0：完全没有梯度", "@follows.forward": "∇KL(π‖ref)",
    "@follows.reverse": "∇KL(ref‖π)", "@follows.neither": "都不是",
    "@why.pos_bind": "裁剪生效：A>0 且 ratio > 1+ε，梯度为 0",
    "@why.pos_low": "未生效：A>0 且 ratio < 1−ε，min 取 r·A，梯度 −A·r",
    "@why.inside": "在 [1−ε, 1+ε] 内：梯度 −A·r",
    "@why.neg_bind": "裁剪生效：A<0 且 ratio < 1−ε，梯度为 0",
    "@why.neg_high": "未生效：A<0 且 ratio > 1+ε，max 取 −r·A，梯度 −A·r",
    "@why.dual_bind": "dual clip 生效：A<0 且 ratio > c，loss 截断为 −c·A，梯度为 0",
    "gae.title": "== 1. GAE 优势估计（Generalized Advantage Estimation）==",
    "gae.intro": "一条 T={T} 步的轨迹，γ={gamma}，λ={lam}（与原示例相同）：\n"
                 "  rewards {r}\n  values  {v}\n  dones   {d}（最后一步后回合结束，不再自举）",
    "gae.step1": "第一步，TD 误差 δ_t = r_t + γ·V_(t+1)·(1 − done_t) − V_t（即 λ = 0 的 gae）：",
    "gae.delta_line": "  δ_{t} = {r} + {g}·{vn}·{c} − {v} = {d}",
    "gae.step2": "第二步，从后往前递推 A_t = δ_t + γλ·A_(t+1)，展开即 A_t = Σ_l (γλ)^l·δ_(t+l)：",
    "gae.adv_line": "  A_{t} = {terms} = {a}",
    "gae.returns": "returns = A + V，Critic 的回归目标：{ret}",
    "gae.grad_intro": "梯度：A_0 如何依赖每个 reward 与每个 value（gae 的手推 VJP，余切向量 e_0，"
                      "旁边是 torch autograd）：",
    "gae.why": "原因：∂A_0/∂r_t = (γλ)^t，γλ = {gl}：第 t 步的奖励经过 t 次衰减到达 A_0。t ≥ 1 时 "
               "∂A_0/∂V_t = γ(γλ)^(t−1) − (γλ)^t = (γλ)^(t−1)·γ(1 − λ)，γ(1 − λ) = {one_minus}："
               "V_t 既是 δ_(t−1) 的自举项（+γ），又是 δ_t 的基线（−1）。λ = 1 时两者抵消（蒙特卡洛："
               "A_0 与之后的 value 无关）；λ = 0 时只有 V_0 和 V_1 起作用。",
    "whiten.title": "== 2. 优势标准化（Advantage Normalization）==",
    "whiten.stats": "对上面的优势在所有 token 上标准化，与 MiniMind 相同（有偏方差，除以 "
                    "sqrt(var + 1e-8)）：\n  mean = {mean}，var = {var}，std = {std}",
    "whiten.result": "  A_norm = (A − mean)/sqrt(var + 1e-8) = {y}",
    "whiten.check": "  验证：mean(A_norm) = {m}，var(A_norm) = {v}",
    "whiten.grad_intro": "梯度：标准化把各 token 耦合在一起。∂y_0/∂A_i，y = A_norm（手推 VJP，"
                         "余切向量 e_0；autograd；闭式解）：",
    "whiten.why": "原因：y = (x − μ)/s，每个 x_i 都会移动 μ（各 −1/N）和 s（−y_0·y_i/N）。这一列之和为 "
                  "{total}：给所有优势加同一个常数不改变结果。",
    "ppo.title": "== 3. PPO clip 策略损失（Clipped Surrogate Objective）==",
    "ppo.intro": "四个 token，旧 log 概率 −1，优势 A = +1，ε = 0.2，裁剪区间 [0.8, 1.2]"
                 "（与原示例相同）。loss = −min(r·A, clip(r, 1−ε, 1+ε)·A)：",
    "ppo.mean": "  各 token 的平均 loss（token-mean）= {m}",
    "ppo.case_split": "分情况讨论，这就是全部梯度：A > 0 时，∂loss/∂logπ = −A·r，直到 r > 1+ε 后为 0；"
                      "A < 0 时为 −A·r，直到 r < 1−ε 后为 0。“裁剪生效”恰好就是梯度为 0 的地方。",
    "ppo.corrections": "对原示例的更正（通过计算得出）：\n"
                       "  - 只有 token 0 被裁剪。token 2 和 3 的 ratio 为 {r2} 和 {r3}，低于 0.8，但 A > 0 "
                       "时 min 取较小的 r·A，裁剪并不生效，它们的梯度是 {g2} 和 {g3}，而不是 0。"
                       "（原示例的“是否裁剪”一列检查的是 clip(r) ≠ r，这不是一回事。）\n"
                       "  - token 2 的 ratio {r2} 不在 [0.8, 1.2] 内；原示例说 token 1、2 在区间内。\n"
                       "  - token 3 的 ratio 是 {r3}，不是 0.37。\n"
                       "  - 对任何一个 token，裁剪都不是双侧的：A 的符号决定唯一可能生效的那一侧。",
    "ppo.dual_intro": "负优势的 dual clip（原示例没有）：A = −1，c = 3。没有它时，A < 0 且 ratio 很大的 "
                      "token 的 loss −A·r 没有上界；dual clip 把 loss 截断在 −c·A：",
    "grpo.title": "== 4. GRPO 组内标准化（Group-normalized Advantage）==",
    "grpo.intro": "两个 prompt，各 4 条回答（原示例的奖励）；A = (r − mean)/(std + 1e-4)，"
                  "有偏 std，与 MiniMind 相同：",
    "grpo.adv": "  A = {a}\n  每组之和为零：{s1}，{s2}（组均值就是基线）",
    "grpo.zero_loss": "ratio 为 1 时 loss 为 0，梯度却不为 0（原示例没有）。logπ = logπ_old 时所有 "
                      "ratio 都是 1，按 seq-mean-token-mean 聚合，loss = −(1/B)·Σ_i A_i = {v}。"
                      "但回答 i 的每个 token 都有 ∂loss/∂logπ = −A_i/(L_i·B)（回答长度 L_i）：",
    "grpo.zero_why": "原因：loss 的值把中心化的优势加总为零，梯度却分别加权每一个。判断训练器要看梯度，"
                     "不要看第一步 loss 为零。",
    "grpo.weights_intro": "每种聚合方式给回答 i 的一个 token 的权重（∂loss/∂l_it；原示例没有）：",
    "grpo.weights_why": "原因：token-mean 对 N = {n} 个 token 一视同仁；seq-mean-token-mean 给每个 "
                        "token 1/(L_i·B)，短回答的 token 权重更大（长度偏差）；seq-mean-token-sum 给 "
                        "1/B，长回答占主导；本参考实现所写的 seq-mean-token-sum-norm（verl 0.9 之前的"
                        "形式）给常数 1/T，这里 B = {B}，T = {T}。Dr. GRPO 与 verl 0.9 中同名的模式还要"
                        "除以 B 行：1/(B·T)，即 norm = T 的 seq-mean-token-sum。",
    "cispo.title": "== 5. CISPO vs PPO clip 对比 ==",
    "cispo.intro": "ratio 为 0.3、0.9、1.5、3.0、5.0，A = +1，logπ = −0.5；PPO 的 ε = 0.2，CISPO 的绝对上界 "
                   "2.0（与原示例相同；MiniMind 默认上界是 5.0）。CISPO 的 loss 是 −sg(w)·A·logπ，"
                   "w = min(r, 2.0)，权重被 detach：",
    "cispo.why": "原因：PPO 的梯度在未裁剪分支生效处为 −A·r，在裁剪生效处为 0；CISPO 的梯度在每个 token "
                 "上都是 −w·A，无论是否被裁剪。最后一列是 d(value)/d logπ，即 w 未 detach 时的梯度。",
    "cispo.corrections": "对原示例的更正（通过计算得出）：\n"
                         "  - ratio 为 0.3 且 A > 0 时，PPO 并不会把 ratio 抬到 0.8：min 保留 0.3，"
                         "梯度为 {g0}。PPO 只在 A < 0 时限制下降。\n"
                         "  - CISPO 不会让被裁剪的 token 停下：ratio 为 3.0 和 5.0 时梯度仍为 {w3} 和 {w4}"
                         "（被截断的是权重，不是更新），而 PPO 在 1.5、3.0、5.0 处梯度为 0。\n"
                         "  - 原示例的“差异”列用 CISPO 的权重减 PPO 的 clip(r)；两种目标真正使用的 ratio "
                         "只在 1.2 以上才不同。",
    "kl.title": "== 6. KL 估计器 k1、k2、k3 ==",
    "kl.intro": "策略 p = {p}，参考 q = {q}（与原示例相同）。在样本 x ~ p 处，令 "
                "u = log(q(x)/p(x))：k1 = −u，k2 = u²/2，k3 = e^u − 1 − u：",
    "kl.per_sample_why": "∂k/∂logπ：k1 为 1，k2 为 logπ − logq，k3 为 1 − q/p（kl_penalty 的手推 VJP，"
                         "与 autograd 一致）。",
    "kl.moments_intro": "x ~ p 下的精确矩（kl_estimator_moments，枚举所有 x）：KL(p‖q) = {kf}，"
                        "KL(q‖p) = {kr}。",
    "kl.grad_intro": "各估计器的梯度到底对应什么：对 logits 的精确期望梯度（kl_estimator_gradient），"
                     "对照 ∇KL(π‖ref) = {fwd} 和 ∇KL(ref‖π) = {rev}：",
    "kl.corrections": "对原示例的更正：\n"
                      "  - k3 是 KL(p‖q) 数值的无偏估计，但作为 loss 使用时（MiniMind 的 PPO 和 GRPO "
                      "正是如此）期望梯度是 ∇KL(q‖p)：它优化的是反向 KL。要跟随 KL(p‖q)，应把 k2 "
                      "作为 loss，或把 k1 作为 detach 的奖励；k1 作为 loss 则完全没有梯度。\n"
                      "  - “k3 ≥ 0，所以方差低”一般并不成立：p = [0.99, 0.01]、q = [0.01, 0.99] 时，"
                      "Var k1 = {v1}，Var k3 = {v3}。只有 p 与 q 接近时 k3 的方差才小。\n"
                      "  - 来自其他策略的样本需要权重 π/μ；detach 后恢复同策略梯度，不 detach 则对 "
                      "E_π[k] 本身求导。",
    "compare.title": "== 7. PPO vs GRPO 对比 ==",
    "@cmp.dimension": "对比维度",
    "@cmp.critic": "Critic", "@cmp.critic.ppo": "需要（Value 网络 V(s)）",
    "@cmp.critic.grpo": "不需要",
    "@cmp.baseline": "基线", "@cmp.baseline.ppo": "V(s_t)，逐 token",
    "@cmp.baseline.grpo": "同一 prompt 组内的平均奖励",
    "@cmp.advantage": "优势", "@cmp.advantage.ppo": "GAE Σ(γλ)^l·δ_(t+l)",
    "@cmp.advantage.grpo": "(r − 组均值)/(组标准差 + eps)",
    "@cmp.clip": "裁剪", "@cmp.clip.ppo": "逐 token，A 的符号决定生效的一侧",
    "@cmp.clip.grpo": "同样的 clip，或 CISPO（MiniMind 默认，上界 5.0）",
    "@cmp.kl": "KL 项", "@cmp.kl.ppo": "k3 作为 loss 项：对应 ∇KL(ref‖π)",
    "@cmp.kl.grpo": "逐 token 的 k3（β = 0.1）：对应 ∇KL(ref‖π)",
    "@cmp.first_loss": "第一步的 loss", "@cmp.first_loss.ppo": "−mean(A)，标准化后 ≈ 0",
    "@cmp.first_loss.grpo": "0（组内中心化）；梯度不为 0",
    "@cmp.early_stop": "早停", "@cmp.early_stop.ppo":
        "MiniMind：approx-KL（k2）> 0.25 时 loss 乘 0；optimizer.step 照常执行",
    "@cmp.early_stop.grpo": "无",
    "@cmp.memory": "显存中的模型", "@cmp.memory.ppo": "Actor + Critic + Ref",
    "@cmp.memory.grpo": "Actor + Ref",
    "compare.numbers": "std 的约定很重要：奖励 [1, 0, 0, 0] 时，MiniMind 的有偏 std 给出 A_0 = {b}，"
                       "TRL 的无偏 std 给出 {u}。",
    # ---------------------------------------------------------------- 8 beyond PPO
    "beyond.title": "== 8. PPO 之外：各种裁剪、门控与权重如何塑造梯度 ==",
    "beyond.intro": "一条 5 个 token 的序列，logπ = −1，比率 r = π/π_old 为 0.5、0.9、1.0、1.3、"
                    "2.5。每列是每个 token 的 ∂loss/∂logπ（手推 VJP，经 autograd 确认）：PPO"
                    "（ε = 0.2）、CISPO（权重 clip(r, 0.8, 1.2)，已 detach）、GSPO（序列比率取几何"
                    "平均，ε = 0.2）、SAPO（τ 为 1.0 / 1.05）、GMPO（在对数空间逐 token 以 ε = 0.2 "
                    "裁剪，再取几何平均），以及把 π_old 视为 rollout 策略的 REINFORCE 的 rollout "
                    "修正：TIS（权重 min(r, 2)，已 detach）与 MIS（权重为 r，超过 2 则为 0）。逐 "
                    "token 方法的列中每个 token 权重为 1（对 token 求和）；GSPO 与 GMPO 的列来自其"
                    "序列 loss，已对 5 个 token 取平均，因此尺度是其他列的 1/5：乘以 5 才可比较。",
    "beyond.pos": "A = +1：",
    "beyond.neg": "A = −1：",
    "beyond.why": "原因：PPO 在比率沿优势方向离开 [1 − ε, 1 + ε] 后把该 token 的梯度截为 0"
                  "（A > 0 时为 r = 1.3 与 2.5，A < 0 时为 r = 0.5）。CISPO 从不截断：每个 token "
                  "都保留 −A 乘以其裁剪并 detach 后的权重。GSPO 与 GMPO 以整条序列为单位：每个 "
                  "token 分得序列梯度的一份（对其 5 个 token 取平均），GMPO 的逐 token 裁剪与 PPO "
                  "一样，只去掉沿优势方向超出 ±ε 的 token。SAPO 以衰减代替截断：其梯度为 "
                  "−A·r·4σ(1 − σ)，σ = σ(τ(r − 1))；权重 4σ(1 − σ) 在 r = 1 处为 1，随 |r − 1| "
                  "以 τ 决定的速度衰减（τ = 1 时梯度随 r 增大直到 r ≈ 2.06，在那里达到峰值 1.575，到 r = 2.5 已降到 1.491）。TIS 保留每个 "
                  "token，权重上限为 2；MIS 丢弃权重超出界限的 token。在 r = 1 处，每种逐 token "
                  "方法都给出 −A，即在策略上的策略梯度。",
}

TEXT = {"en": EN, "zh": ZH}
