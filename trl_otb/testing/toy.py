"""An exactly solvable policy for calibrating gradient estimators: every completion is enumerated, so the true
policy gradient g and an estimator's exact mean E ĝ and covariance over groups of N are sums, not samples.

The policy is a softmax over a vocabulary ``0 .. V-1`` (0 is EOS) with logits ``theta[t, prev]`` for position t and
previous token ``prev`` (0 at t = 0): ``D = L * V * V`` parameters. A completion is k < L non-EOS tokens and EOS, or
L non-EOS tokens (cut at the length limit). Its per-token score is s_t = ∂ log π(y_t)/∂theta, which is
``e_{y_t} - π_t`` in block (t, prev) and 0 elsewhere, so the logit-gradient proxy w_t = 1 - 2π(y_t) + Σπ² equals
‖s_t‖² exactly.

The default reward is a counting task: n ``a`` tokens (token 1) then EOS scores 1; counting on (more ``a``, or the
limit) 0.5; stopping early 0; any ``b`` (token 2 or above, an error) 0.2.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

Estimator = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def count_reward(tokens: list[int], n: int = 1) -> float:
    """1 for n ``a`` then EOS; 0.5 for counting on; 0 for stopping early; 0.2 for an error token."""
    body = tokens[:-1] if tokens and tokens[-1] == 0 else tokens
    if any(t >= 2 for t in body):
        return 0.2
    if len(body) == n and tokens[-1:] == [0]:
        return 1.0
    return 0.5 if len(body) > n or tokens[-1:] != [0] else 0.0


@dataclass
class ToyPolicy:
    """Every completion of the policy ``theta`` ``[L, V, V]``: ``tokens`` (padded with 0), ``mask``, ``prob``,
    ``scores`` ``[S, L, D]``, ``proxy`` ``[S, L]`` and ``rewards`` ``[S]``, in float64."""

    theta: torch.Tensor
    reward: Callable[[list[int]], float] = count_reward

    def __post_init__(self):
        L, V, _ = self.theta.shape
        self.length, self.vocab, self.dim = L, V, L * V * V
        seqs = [[*body, 0] for k in range(L) for body in itertools.product(range(1, V), repeat=k)]
        seqs += [list(body) for body in itertools.product(range(1, V), repeat=L)]
        S = len(seqs)
        self.sequences = seqs
        self.mask = torch.zeros(S, L, dtype=torch.float64)
        self.scores = torch.zeros(S, L, self.dim, dtype=torch.float64)
        self.proxy = torch.zeros(S, L, dtype=torch.float64)
        logp = torch.zeros(S, dtype=torch.float64)
        pi_all = torch.softmax(self.theta.double(), dim=-1)
        for s, seq in enumerate(seqs):
            prev = 0
            for t, y in enumerate(seq):
                pi = pi_all[t, prev]
                block = torch.zeros(L, V, V, dtype=torch.float64)
                block[t, prev] = -pi
                block[t, prev, y] += 1.0
                self.scores[s, t] = block.reshape(-1)
                self.proxy[s, t] = 1 - 2 * pi[y] + (pi**2).sum()
                self.mask[s, t] = 1.0
                logp[s] += pi[y].log()
                prev = y
        self.prob = logp.exp()
        self.rewards = torch.tensor([self.reward(seq) for seq in seqs], dtype=torch.float64)

    def true_gradient(self) -> torch.Tensor:
        """g = Σ_y p(y) R(y) ∇ log p(y), ``[D]``."""
        return torch.einsum("s,s,sd->d", self.prob, self.rewards, self.scores.sum(1))

    def group_gradients(self, index: torch.Tensor, estimator: Estimator) -> torch.Tensor:
        """The one-group gradients ĝ = (1/N) Σ_i Σ_t A_t^i s_t^i of the groups ``index`` ``[M, N]`` (rows of the
        enumeration), ``[M, D]``, with advantages from ``estimator(rewards, proxy, mask, group_ids)``."""
        M, N = index.shape
        flat = index.reshape(-1)
        group_ids = torch.arange(M).repeat_interleave(N)
        adv = estimator(self.rewards[flat], self.proxy[flat], self.mask[flat], group_ids).double()
        return torch.einsum("bt,btd->bd", adv * self.mask[flat], self.scores[flat]).reshape(M, N, -1).mean(1)

    def exact_moments(self, estimator: Estimator, N: int, chunk: int = 20_000) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact mean ``[D]`` and covariance ``[D, D]`` of ``estimator``'s one-group gradient over every group
        of N independent completions (S**N groups: keep S and N small)."""
        S = len(self.sequences)
        total = S**N
        mean = torch.zeros(self.dim, dtype=torch.float64)
        second = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for start in range(0, total, chunk):
            codes = torch.arange(start, min(start + chunk, total))
            index = torch.stack([(codes // S**k) % S for k in range(N)], dim=1)
            weight = self.prob[index].prod(1)
            grads = self.group_gradients(index, estimator)
            mean += weight @ grads
            second += grads.T @ (grads * weight[:, None])
        return mean, second - torch.outer(mean, mean)

    def sample_groups(self, groups: int, N: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``groups`` groups of N completions drawn from the policy, as rows of the enumeration ``[groups, N]``."""
        return torch.multinomial(self.prob, groups * N, replacement=True, generator=generator).reshape(groups, N)


def toy_policy(length: int = 3, vocab: int = 3, seed: int = 0, scale: float = 1.0, **kwargs) -> ToyPolicy:
    """A ``ToyPolicy`` with logits drawn from N(0, scale²) by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    theta = scale * torch.randn(length, vocab, vocab, generator=generator, dtype=torch.float64)
    return ToyPolicy(theta, **kwargs)
