"""OTBConfig: GRPOConfig plus the Optimal Token Baseline options, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from .baselines import ALIGNS, ESTIMATORS, TAILS

PROXIES = ("logit", "uniform")
# Losses that use the advantage elementwise, token by token: token-level advantages are well defined.
TOKEN_LEVEL_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo")
# VESPO picks its gamma shape per *sequence* from the advantage's sign; OTB's sign can change inside a sequence.
SEQUENCE_SIGN_LOSSES = ("vespo",)
SEQUENCE_LEVEL_ESTIMATORS = ("grpo", "rloo", "opo", "ogb")


@dataclass
class OTBConfig(GRPOConfig):
    r"""
    Configuration for [`OTBTrainer`]: every [`trl.GRPOConfig`] field, plus the options below.

    Parameters:
        advantage_estimator (`str`, *optional*, defaults to `"otb"`):
            How advantages are formed from rewards. `"otb"`: the Optimal Token Baseline (token-level,
            energy-weighted). `"grpo"`: TRL's group mean (with `scale_rewards`). `"rloo"`: leave-one-out
            mean. `"opo"`: length-weighted mean. `"ogb"`: energy-weighted mean, one value per sequence.
        otb_proxy (`str`, *optional*, defaults to `"logit"`):
            Per-token weight w_t of the energy. `"logit"`: 1 - 2 pi(y_t) + sum_v pi(v)^2 from the rollout
            pass. `"uniform"`: w_t = 1 (the paper's uniform ablation; no extra statistics needed).
        otb_epsilon (`float`, *optional*, defaults to `1e-8`):
            Added to the baseline's denominator sum_i W_t^(i).
        otb_tail (`str`, *optional*, defaults to `"zero"`):
            `"zero"`: a strictly-longest completion gets baseline 0 past the second-longest length
            (reference behaviour). `"none"`: keep the computed baseline (advantage ~0 there).
        otb_align (`str` or `None`, *optional*, defaults to `None`):
            `"position"` compares group members at the same completion index, `"valid"` at their k-th
            model-generated token. `None` picks `"valid"` when a tool mask is present, else `"position"`.
        otb_leave_one_out (`bool`, *optional*, defaults to `False`):
            Each member's baseline uses only the other members (removes the O(1/N) self-inclusion bias).
        otb_fidelity_check_steps (`int`, *optional*, defaults to `0`):
            Every this many optimizer steps (at a generation batch), compare the proxy with the exact
            per-token gradient norm of the trained parameters on `otb_fidelity_rows` rollout rows and log
            `otb/fidelity/*`. 0 turns it off. Costs about one single-row backward per token checked.
        otb_fidelity_rows (`int`, *optional*, defaults to `2`):
            Rollout rows per process used by the fidelity check.
        otb_fidelity_min_energy_spearman (`float`, *optional*, defaults to `0.85`):
            Warn when the Spearman correlation between the proxy's energy W_t and the exact one falls below
            this (measured 0.91-0.93 on SmolLM2 full, LoRA and QLoRA; see docs/fidelity.md).
        num_generations (`int`, *optional*, defaults to `4`):
            Group size N. OTB needs N >= 2; the paper reports N=4 matching baselines at N=32.
        scale_rewards (`str`, *optional*, defaults to `"none"`):
            As in GRPOConfig, but OTB advantages are raw (no std division), so only `"grpo"` accepts
            another value.
    """

    advantage_estimator: str = field(
        default="otb",
        metadata={
            "help": "How advantages are formed: 'otb' (Optimal Token Baseline, token-level), 'grpo' (group mean, "
            "uses scale_rewards), 'rloo' (leave-one-out mean), 'opo' (length-weighted mean) or 'ogb' "
            "(energy-weighted mean, one value per sequence)."
        },
    )
    otb_proxy: str = field(
        default="logit",
        metadata={
            "help": "Per-token weight of the energy: 'logit' (1 - 2 pi(y) + sum pi^2, from the rollout pass) or "
            "'uniform' (w = 1, the paper's ablation)."
        },
    )
    otb_epsilon: float = field(
        default=1e-8,
        metadata={"help": "Added to the OTB baseline's denominator sum_i W_t m_t."},
    )
    otb_tail: str = field(
        default="zero",
        metadata={
            "help": "'zero': a strictly-longest completion gets baseline 0 past the second-longest length "
            "(reference behaviour); 'none': keep the computed baseline."
        },
    )
    otb_align: str | None = field(
        default=None,
        metadata={
            "help": "'position' (same completion index) or 'valid' (k-th model-generated token, for tool calling). "
            "None: 'valid' when a tool mask is present, else 'position'."
        },
    )
    otb_leave_one_out: bool = field(
        default=False,
        metadata={"help": "Each member's OTB baseline uses only the other members of its group."},
    )
    otb_fidelity_check_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many optimizer steps, check the proxy against exact per-token gradient norms of the "
            "trained parameters on a few rollout rows and log otb/fidelity/*. 0 = off."
        },
    )
    otb_fidelity_rows: int = field(
        default=2,
        metadata={"help": "Rollout rows per process used by the fidelity check."},
    )
    otb_fidelity_min_energy_spearman: float = field(
        default=0.85,
        metadata={"help": "Warn when the energy W_t's Spearman correlation with the exact one falls below this."},
    )
    num_generations: int | None = field(
        default=4,
        metadata={"help": "Number of completions per prompt (group size N). OTB needs N >= 2."},
    )
    scale_rewards: str = field(
        default="none",
        metadata={
            "help": "Reward scaling as in GRPOConfig ('none', 'group', 'batch'). OTB advantages are raw, so only "
            "advantage_estimator='grpo' accepts a value other than 'none'."
        },
    )

    def __post_init__(self):
        self._validate_otb()
        super().__post_init__()

    def _validate_otb(self):
        def fail(message):
            raise ValueError(f"OTBConfig: {message}")

        if self.advantage_estimator not in ESTIMATORS:
            fail(f"unknown advantage_estimator={self.advantage_estimator!r}; choose one of {sorted(ESTIMATORS)}.")
        if self.otb_proxy not in PROXIES:
            fail(f"unknown otb_proxy={self.otb_proxy!r}; choose one of {list(PROXIES)}.")
        if self.otb_tail not in TAILS:
            fail(f"unknown otb_tail={self.otb_tail!r}; choose one of {list(TAILS)}.")
        if self.otb_align is not None and self.otb_align not in ALIGNS:
            fail(f"unknown otb_align={self.otb_align!r}; choose one of {list(ALIGNS)} or None (automatic).")
        if not (isinstance(self.otb_epsilon, int | float) and self.otb_epsilon >= 0):
            fail(f"otb_epsilon must be a number >= 0, got {self.otb_epsilon!r}.")
        if not (isinstance(self.otb_fidelity_check_steps, int) and self.otb_fidelity_check_steps >= 0):
            fail(f"otb_fidelity_check_steps must be an integer >= 0 (0 = off), got {self.otb_fidelity_check_steps!r}.")
        if not (isinstance(self.otb_fidelity_rows, int) and self.otb_fidelity_rows >= 1):
            fail(f"otb_fidelity_rows must be an integer >= 1, got {self.otb_fidelity_rows!r}.")
        if not -1.0 <= self.otb_fidelity_min_energy_spearman <= 1.0:
            fail(
                f"otb_fidelity_min_energy_spearman is a correlation in [-1, 1], got {self.otb_fidelity_min_energy_spearman}."
            )
        if self.num_generations is not None and self.num_generations < 2:
            fail(
                f"num_generations={self.num_generations}: OTB compares completions of the same prompt, so training "
                "needs at least 2 per group (with 1 it degenerates to plain REINFORCE). Set num_generations >= 2 "
                "(4 is the paper's choice)."
            )
        # num_generations_eval=1 is allowed: evaluation takes no gradient step, and a singleton group has baseline 0
        # (OTB.md section 2), so each evaluation completion's advantage is its reward.
        if self.num_generations_eval is not None and self.num_generations_eval < 1:
            fail(f"num_generations_eval={self.num_generations_eval}: set it to 1 or more (or None: num_generations).")
        scale = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        if self.advantage_estimator != "grpo" and scale != "none":
            fail(
                f"scale_rewards={self.scale_rewards!r} divides advantages by a reward std, but "
                f"advantage_estimator={self.advantage_estimator!r} uses raw advantages. Set scale_rewards='none', "
                "or use advantage_estimator='grpo' for std-scaled GRPO."
            )
        if self.advantage_estimator != "grpo" and self.multi_objective_aggregation != "sum_then_normalize":
            fail(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} normalises each reward per group; "
                f"advantage_estimator={self.advantage_estimator!r} needs the raw weighted reward sum. Set "
                "multi_objective_aggregation='sum_then_normalize'."
            )
        token_level = self.advantage_estimator == "otb"
        if token_level and self.loss_type in SEQUENCE_SIGN_LOSSES:
            fail(
                f"loss_type={self.loss_type!r} chooses its weighting per sequence from the advantage's sign, but OTB "
                "advantages are token-level and can change sign within a sequence. Use one of "
                f"{list(TOKEN_LEVEL_LOSSES)} (e.g. 'dapo'), or a sequence-level advantage_estimator "
                f"({list(SEQUENCE_LEVEL_ESTIMATORS)})."
            )
        if token_level and self.off_policy_mask_threshold is not None:
            fail(
                "off_policy_mask_threshold masks whole sequences by the sign of their advantage, which OTB's "
                "token-level advantages do not have. Unset off_policy_mask_threshold, or use a sequence-level "
                f"advantage_estimator ({list(SEQUENCE_LEVEL_ESTIMATORS)})."
            )
        if self.use_liger_kernel and (self.liger_kernel_config or {}).get("fused_linear_cross_entropy"):
            fail(
                "Liger's fused linear cross-entropy replaces the model's forward and never exposes sum_v pi(v)^2, "
                "which the OTB proxy needs. Drop fused_linear_cross_entropy from liger_kernel_config."
            )


def otb_fields_markdown() -> str:
    """The Markdown table of OTBConfig's own fields (and the GRPOConfig defaults it changes), from the help metadata.

    ``docs/api.md`` embeds it verbatim; a test keeps the two in sync.
    """
    from dataclasses import MISSING, fields

    parent = {f.name: f for f in fields(GRPOConfig)}
    rows = ["| field | default | help |", "|---|---|---|"]
    for f in fields(OTBConfig):
        if f.name in parent and parent[f.name].default == f.default:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        rows.append(f"| `{f.name}` | `{default!r}` | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"
