"""OTBConfig: GRPOConfig plus the Optimal Token Baseline options, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from .core import ALIGNS, ESTIMATORS, TAILS

# The per-token weights training can use (trl_otb.fidelity compares more candidates, offline).
TRAINING_PROXIES = ("logit", "uniform")
# TRL losses that use the advantage elementwise, token by token: the only ones a token-level estimator may feed.
# (VESPO picks its gamma shape per *sequence* from the advantage's sign, which OTB's can change inside a sequence.)
TOKEN_LEVEL_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo")
# OTBConfig field -> the estimator option it sets (trl_otb.core's registry says which estimator takes which).
ESTIMATOR_OPTION_FIELDS = {
    "otb_epsilon": "eps",
    "otb_tail": "tail",
    "otb_align": "align",
    "otb_leave_one_out": "leave_one_out",
}


@dataclass
class OTBConfig(GRPOConfig):
    r"""
    Configuration for [`OTBTrainer`]: every [`trl.GRPOConfig`] field, plus the options below.

    Parameters:
        advantage_estimator (`str`, *optional*, defaults to `"otb"`):
            How advantages are formed from rewards. `"otb"`: the Optimal Token Baseline (token-level,
            energy-weighted). `"grpo"`: TRL's own advantages, as GRPOTrainer computes them (group mean, with
            `scale_rewards` and `multi_objective_aggregation`), but for one difference: a completion with a +-inf
            reward is unscorable (advantage 0), where GRPOTrainer would give its whole group non-finite
            advantages. `"rloo"`: leave-one-out mean. `"opo"`: length-weighted mean. `"ogb"`: energy-weighted mean, one value per sequence.
        otb_proxy (`str`, *optional*, defaults to `"logit"`):
            Per-token weight w_t of the energy. `"logit"`: 1 - 2 pi(y_t) + sum_v pi(v)^2 from the rollout
            pass. `"uniform"`: w_t = 1 (the paper's uniform ablation; no extra statistics needed).
        otb_epsilon (`float`, *optional*, defaults to `1e-8`):
            Added to the baseline's denominator sum_i W_t^(i).
        otb_tail (`str`, *optional*, defaults to `"zero_advantage"`):
            The baseline where a group cannot estimate one: a token where its completion is the only one of the
            group still active (the tail of a strictly-longest completion, a group with one valid completion, and
            with `otb_leave_one_out` any token no other completion shares). Offset-dependent (A = R where the
            baseline is forced to 0, so adding a constant to every reward changes those advantages):
            `"zero"`, the reference (verl's rule, baseline 0 past the second-longest length) and `"none"` (the
            computed baseline, advantage ~0 there). Shift-invariant (rewards centred in their group first; a
            group whose rewards tie gets advantage 0 exactly): `"group_mean"` (the group's mean reward),
            `"sequence_baseline"` (the group's energy-weighted sequence-level baseline, OGB's),
            `"last_baseline"` (the last baseline two or more completions shared), `"zero_advantage"` (no
            update there). The default, `"zero_advantage"` (without leave-one-out or std scaling), was chosen by
            the second training study's pre-registered rule (docs/benchmarks.md, "Should I use OTB?"): no
            shift-invariant candidate trained at least as well as TRL's default GRPO on every task, so the rule
            fell back to the candidate with the lowest gradient MSE at N=4 (docs/method.md says why; OTB did not
            match GRPO in training). docs/options.md compares the values.
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
            Group size N. OTB needs N >= 2. The paper reports OTB at N=4 matching baselines at N=32; this
            project's two training studies did not reproduce that at their scale: no OTB at N=4 trained at least as
            well as TRL's GRPO at N=4 on every task (docs/benchmarks.md, "Should I use OTB?").
        scale_rewards (`str` or `None`, *optional*, defaults to `None`):
            As in GRPOConfig (`"group"`, `"batch"`, `"none"`). `None` follows `advantage_estimator`: `"group"`,
            GRPOConfig's default, for `"grpo"` (TRL's GRPO as GRPOTrainer runs it); `"none"` for the others, whose
            advantages are raw (no std division) and which refuse any other value.
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
        default="zero_advantage",
        metadata={
            "help": "Baseline where one completion alone is active in its group. Offset-dependent: 'zero' (the "
            "reference: baseline 0, A = R past the second-longest length), 'none' (the computed baseline). "
            "Shift-invariant (rewards centred per group; ties give 0): 'group_mean', 'sequence_baseline' (OGB's), "
            "'last_baseline' (last shared one), 'zero_advantage' (the default: A = 0 there)."
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
    scale_rewards: str | None = field(
        default=None,
        metadata={
            "help": "Reward scaling as in GRPOConfig ('group', 'batch', 'none'). None follows advantage_estimator: "
            "'group' (GRPOConfig's default) for 'grpo', 'none' for the others, whose advantages are raw and which "
            "accept no other value."
        },
    )

    def __post_init__(self):
        self._validate_otb_fields()
        if self.scale_rewards is None:  # resolved before TRL reads it: TRL's trainer knows no None
            self.scale_rewards = "group" if self.advantage_estimator == "grpo" else "none"
        super().__post_init__()  # TRL normalises its own fields first (scale_rewards=True -> "group", ...)
        self._validate_against_grpo()

    def _validate_otb_fields(self):
        """OTBConfig's own fields, and the options the chosen estimator does not use."""
        if self.advantage_estimator not in ESTIMATORS:
            _fail(f"unknown advantage_estimator={self.advantage_estimator!r}; choose one of {sorted(ESTIMATORS)}.")
        if self.otb_proxy not in TRAINING_PROXIES:
            _fail(f"unknown otb_proxy={self.otb_proxy!r}; choose one of {list(TRAINING_PROXIES)}.")
        if self.otb_tail not in TAILS:
            _fail(f"unknown otb_tail={self.otb_tail!r}; choose one of {list(TAILS)}.")
        if self.otb_align is not None and self.otb_align not in ALIGNS:
            _fail(f"unknown otb_align={self.otb_align!r}; choose one of {list(ALIGNS)} or None (automatic).")
        if not (isinstance(self.otb_epsilon, int | float) and self.otb_epsilon >= 0):
            _fail(f"otb_epsilon must be a number >= 0, got {self.otb_epsilon!r}.")
        if not (isinstance(self.otb_fidelity_check_steps, int) and self.otb_fidelity_check_steps >= 0):
            _fail(
                f"otb_fidelity_check_steps must be an integer >= 0 (0 = off), got {self.otb_fidelity_check_steps!r}."
            )
        if not (isinstance(self.otb_fidelity_rows, int) and self.otb_fidelity_rows >= 1):
            _fail(f"otb_fidelity_rows must be an integer >= 1, got {self.otb_fidelity_rows!r}.")
        if not -1.0 <= self.otb_fidelity_min_energy_spearman <= 1.0:
            _fail(
                f"otb_fidelity_min_energy_spearman is a correlation in [-1, 1], got {self.otb_fidelity_min_energy_spearman}."
            )
        if not self.temperature > 0:
            _fail(
                f"temperature={self.temperature!r}: training samples completions from softmax(z / temperature) and "
                "scores their tokens under that distribution (TRL's log-probs, and OTB's proxy 1 - 2 pi(y) + sum pi^2), "
                "and temperature <= 0 (greedy decoding) has none. Set temperature > 0: 1.0 (TRL's default) samples "
                "the model as it is, lower values (e.g. 0.7) closer to greedy."
            )
        if self.num_generations is not None and self.num_generations < 2:
            _fail(
                f"num_generations={self.num_generations}: OTB compares completions of the same prompt, so training "
                "needs at least 2 per group (with 1 it degenerates to plain REINFORCE). Set num_generations >= 2 "
                "(4 is the paper's choice)."
            )
        # num_generations_eval=1 is allowed: evaluation takes no gradient step. Each evaluation completion is a
        # singleton group: advantage R under the reference tail ("zero"/"none"), 0 under every other estimator/tail.
        if self.num_generations_eval is not None and self.num_generations_eval < 1:
            _fail(f"num_generations_eval={self.num_generations_eval}: set it to 1 or more (or None: num_generations).")
        estimator = ESTIMATORS[self.advantage_estimator]
        defaults = {f.name: f.default for f in fields(OTBConfig)}
        for name, option in ESTIMATOR_OPTION_FIELDS.items():
            if getattr(self, name) != defaults[name] and option not in estimator.options:
                _fail(
                    f"{name}={getattr(self, name)!r} has no effect with advantage_estimator="
                    f"{self.advantage_estimator!r}, which takes {_options_text(estimator)}. Leave {name} at its "
                    f"default ({defaults[name]!r}), or use an estimator that takes it "
                    f"({[e for e in ESTIMATORS if option in ESTIMATORS[e].options]})."
                )
        if self.otb_proxy != defaults["otb_proxy"] and not estimator.uses_proxy:
            _fail(
                f"otb_proxy={self.otb_proxy!r} has no effect with advantage_estimator={self.advantage_estimator!r}, "
                f"which uses no per-token weight. Leave otb_proxy at its default, or use one of "
                f"{[e for e in ESTIMATORS if ESTIMATORS[e].uses_proxy]}."
            )

    def _validate_against_grpo(self):
        """The GRPOConfig fields (as TRL normalised them) that the chosen estimator cannot honour."""
        estimator = ESTIMATORS[self.advantage_estimator]
        if self.advantage_estimator != "grpo" and self.scale_rewards != "none":
            _fail(
                f"scale_rewards={self.scale_rewards!r} divides advantages by a reward std, but "
                f"advantage_estimator={self.advantage_estimator!r} uses raw advantages. Set scale_rewards='none', "
                "or use advantage_estimator='grpo' for std-scaled GRPO."
            )
        if self.advantage_estimator != "grpo" and self.multi_objective_aggregation != "sum_then_normalize":
            _fail(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} normalises each reward per group; "
                f"advantage_estimator={self.advantage_estimator!r} needs the raw weighted reward sum. Set "
                "multi_objective_aggregation='sum_then_normalize'."
            )
        sequence_level = [name for name, e in ESTIMATORS.items() if not e.token_level]
        if estimator.token_level and self.loss_type not in TOKEN_LEVEL_LOSSES:
            _fail(
                f"loss_type={self.loss_type!r} is not one of the losses that use the advantage token by token "
                f"({list(TOKEN_LEVEL_LOSSES)}; 'vespo' chooses its weighting per sequence from the advantage's sign), "
                f"but advantage_estimator={self.advantage_estimator!r} gives token-level advantages that can change "
                f"sign within a sequence. Use one of those losses (e.g. 'dapo'), or a sequence-level "
                f"advantage_estimator ({sequence_level})."
            )
        if estimator.token_level and self.off_policy_mask_threshold is not None:
            _fail(
                "off_policy_mask_threshold masks whole sequences by the sign of their advantage, which OTB's "
                "token-level advantages do not have. Unset off_policy_mask_threshold, or use a sequence-level "
                f"advantage_estimator ({sequence_level})."
            )


def _fail(message: str):
    raise ValueError(f"OTBConfig: {message}")


def _options_text(estimator) -> str:
    taken = [f for f, option in ESTIMATOR_OPTION_FIELDS.items() if option in estimator.options]
    return "no OTB option" if not taken else ", ".join(taken)


def otb_fields_markdown() -> str:
    """The Markdown table of OTBConfig's own fields (and the GRPOConfig defaults it changes), from the help metadata.

    ``docs/api.md`` embeds it verbatim; a test keeps the two in sync.
    """
    from dataclasses import MISSING

    parent = {f.name: f for f in fields(GRPOConfig)}
    rows = ["| field | default | help |", "|---|---|---|"]
    for f in fields(OTBConfig):
        if f.name in parent and parent[f.name].default == f.default:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        rows.append(f"| `{f.name}` | `{default!r}` | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"
