"""OTBConfig: GRPOConfig plus the Optimal Token Baseline options, validated at construction."""

from __future__ import annotations

import functools
import math
import types
import warnings
from dataclasses import dataclass, field, fields
from typing import Literal, get_origin, get_type_hints

from trl import GRPOConfig

from .core import ALIGNS, ESTIMATORS, SHRINKAGES, check_tail, resolve_shrinkage

# The per-token weights training can use (trl_otb.fidelity compares more candidates, offline).
TRAINING_PROXIES = ("logit", "uniform")
# TRL losses that use the advantage elementwise, token by token: the only ones a token-level estimator may feed.
# (VESPO picks its gamma shape per *sequence* from the advantage's sign, which OTB's can change inside a sequence.)
TOKEN_LEVEL_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo")
# The type an OTB field takes where its annotation says less than TRL reads: GRPOConfig turns scale_rewards=True into
# "group", and num_generations=None fails inside TRL (it divides by it).
_TYPE_OVERRIDES = {"scale_rewards": (str, bool, type(None)), "num_generations": (int,)}
# Closed ranges [low, high] of the numeric OTB fields (None: unbounded on that side).
_RANGES = {
    "otb_epsilon": (0.0, None),
    "otb_fidelity_check_steps": (0, None),
    "otb_fidelity_rows": (1, None),
    "otb_fidelity_min_energy_spearman": (-1.0, 1.0),
}  # num_generations >= 2 is checked with its reason in _validate_otb_fields


@dataclass
class OTBConfig(GRPOConfig):
    r"""
    Configuration for [`OTBTrainer`]: every [`trl.GRPOConfig`] field, plus the options below.

    Each option's semantics are written once, in docs/options.md (one section per option).

    Parameters:
        advantage_estimator (`str`, *optional*, defaults to `"otb"`):
            How advantages are formed: `"otb"` (token-level OTB), `"grpo"` (TRL's own), `"rloo"`, `"opo"` or `"ogb"`.
        otb_proxy (`str`, *optional*, defaults to `"logit"`):
            Per-token weight w_t of the energy: `"logit"` (1 - 2 pi(y_t) + sum_v pi(v)^2) or `"uniform"` (w_t = 1).
        otb_epsilon (`float`, *optional*, defaults to `1e-8`):
            Added to the baseline's denominator sum_i W_t^(i).
        otb_tail (`str`, *optional*, defaults to `"others_mean"`):
            The baseline at a token no other member of the group shares; `"others_mean"`: the others' mean reward.
        otb_align (`str` or `None`, *optional*, defaults to `None`):
            Compare members at the same index (`"position"`) or k-th model token (`"valid"`); `None` picks by tool mask.
        otb_leave_one_out (`bool`, *optional*, defaults to `True`):
            Each member's baseline uses only the other members of its group (exactly unbiased; Li et al.'s OTB
            includes the member itself).
        otb_shrinkage (`str` or `None`, *optional*, defaults to `None`):
            `"ess"` shrinks the leave-one-out baseline toward the others' mean by its effective sample size; `None`
            means `"ess"` where it applies (leave-one-out with `otb_tail="others_mean"`) and `"none"` elsewhere.
        otb_fidelity_check_steps (`int`, *optional*, defaults to `0`):
            Every this many optimizer steps, check the proxy against exact per-token gradient norms; 0 turns it off.
        otb_fidelity_rows (`int`, *optional*, defaults to `2`):
            Rollout rows per process used by the fidelity check.
        otb_fidelity_min_energy_spearman (`float`, *optional*, defaults to `0.85`):
            Warn when the proxy energy's Spearman correlation with the exact one falls below this.
        num_generations (`int`, *optional*, defaults to `4`):
            Group size N; training needs N >= 2.
        scale_rewards (`str` or `None`, *optional*, defaults to `None`):
            As in GRPOConfig; `None` means `"group"` for `"grpo"` and `"none"` (raw advantages) for the others.
    """

    advantage_estimator: str = field(
        default="otb",
        metadata={
            "help": "How advantages are formed: 'otb' (token-level OTB), 'grpo' (TRL's own), 'rloo', 'opo' or 'ogb'. "
            "See docs/options.md#advantage_estimator."
        },
    )
    otb_proxy: str = field(
        default="logit",
        metadata={
            "help": "Per-token weight w_t of the energy: 'logit' (1 - 2 pi(y) + sum pi^2) or 'uniform' (w = 1). "
            "See docs/options.md#otb_proxy."
        },
    )
    otb_epsilon: float = field(
        default=1e-8,
        metadata={"help": "Added to the baseline's denominator sum_i W_t m_t. See docs/options.md#otb_epsilon."},
    )
    otb_tail: str = field(
        default="others_mean",
        metadata={
            "help": "The baseline at a token no other member of the group shares; 'others_mean' is the other "
            "members' mean reward. See docs/options.md#otb_tail."
        },
    )
    otb_align: str | None = field(
        default=None,
        metadata={
            "help": "Compare members at the same index ('position') or k-th model token ('valid'); None picks by "
            "tool mask. See docs/options.md#otb_align."
        },
    )
    otb_leave_one_out: bool = field(
        default=True,
        metadata={
            "help": "Each member's baseline uses only the other members of its group. "
            "See docs/options.md#otb_leave_one_out."
        },
    )
    otb_shrinkage: str | None = field(
        default=None,
        metadata={
            "help": "'ess' shrinks the leave-one-out baseline toward the others' mean by its effective sample size "
            "(needs otb_leave_one_out=True, otb_tail='others_mean'); None: 'ess' where it applies, else 'none'. "
            "See docs/options.md#otb_shrinkage."
        },
    )
    otb_fidelity_check_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many optimizer steps, check the proxy against exact per-token gradient norms; "
            "0 = off. See docs/options.md#otb_fidelity."
        },
    )
    otb_fidelity_rows: int = field(
        default=2,
        metadata={"help": "Rollout rows per process used by the fidelity check. See docs/options.md#otb_fidelity."},
    )
    otb_fidelity_min_energy_spearman: float = field(
        default=0.85,
        metadata={
            "help": "Warn when the proxy energy's Spearman correlation with the exact one falls below this. "
            "See docs/options.md#otb_fidelity."
        },
    )
    num_generations: int | None = field(
        default=4,
        metadata={"help": "Group size N; training needs N >= 2. See docs/options.md#num_generations."},
    )
    scale_rewards: str | None = field(
        default=None,
        metadata={
            "help": "As in GRPOConfig; None means 'group' for 'grpo' and 'none' (raw advantages) for the others. "
            "See docs/options.md#scale_rewards."
        },
    )

    def __post_init__(self):
        _validate_otb_types(self)
        self._validate_otb_fields()
        if self.scale_rewards is None:  # resolved before TRL reads it: TRL's trainer knows no None
            self.scale_rewards = "group" if self.advantage_estimator == "grpo" else "none"
        with warnings.catch_warnings():
            # gradient_checkpointing is a GRPOConfig field (TRL's default True, and TRL's documented name), which
            # transformers warns about on every config: that one message is silenced; every other warning shows.
            warnings.filterwarnings("ignore", message=_CHECKPOINTING_DEPRECATION, category=FutureWarning)
            super().__post_init__()  # TRL normalises its own fields first (scale_rewards=True -> "group", ...)
        self._validate_against_grpo()

    def estimator_options(self, *, align: str | None = None) -> dict[str, object]:
        """The keyword arguments this config gives the chosen estimator's function, by name.

        ``compute_advantages(self.advantage_estimator, ..., **self.estimator_options())`` runs the configured
        estimator. Options it does not take are left out; ``is_weights`` comes from the batch, not the config.
        ``align`` is the batch's resolved alignment; without it, ``otb_align`` (``"position"`` when that is None).
        """
        options = {option: value for option, (_, value) in self._option_fields().items()}
        options["align"] = align or self.otb_align or "position"
        options["shrinkage"] = resolve_shrinkage(self.otb_shrinkage, self.otb_tail, self.otb_leave_one_out)
        taken = ESTIMATORS[self.advantage_estimator].options
        return {option: value for option, value in options.items() if option in taken}

    def _option_fields(self) -> dict[str, tuple[str, object]]:
        """Estimator option -> (the OTBConfig field that sets it, its value): where a field meets its option."""
        return {
            "eps": ("otb_epsilon", self.otb_epsilon),
            "tail": ("otb_tail", self.otb_tail),
            "align": ("otb_align", self.otb_align),
            "leave_one_out": ("otb_leave_one_out", self.otb_leave_one_out),
            "shrinkage": ("otb_shrinkage", self.otb_shrinkage),
        }

    def _fields_taken_text(self) -> str:
        taken = ESTIMATORS[self.advantage_estimator].options
        names = [name for option, (name, _) in self._option_fields().items() if option in taken]
        return ", ".join(names) if names else "no OTB option"

    def _validate_otb_fields(self):
        """OTBConfig's own fields, and the options the chosen estimator does not use."""
        if self.advantage_estimator not in ESTIMATORS:
            _fail(f"unknown advantage_estimator={self.advantage_estimator!r}; choose one of {sorted(ESTIMATORS)}.")
        if self.otb_proxy not in TRAINING_PROXIES:
            _fail(f"unknown otb_proxy={self.otb_proxy!r}; choose one of {list(TRAINING_PROXIES)}.")
        try:
            check_tail(self.otb_tail, name="otb_tail")  # a removed tail: says why, and what to use instead
        except ValueError as error:
            _fail(str(error))
        if self.otb_align is not None and self.otb_align not in ALIGNS:
            _fail(f"unknown otb_align={self.otb_align!r}; choose one of {list(ALIGNS)} or None (automatic).")
        if self.otb_shrinkage is not None and self.otb_shrinkage not in SHRINKAGES:
            _fail(f"unknown otb_shrinkage={self.otb_shrinkage!r}; choose one of {list(SHRINKAGES)} or None.")
        if self.otb_shrinkage not in (None, "none") and not (
            self.otb_leave_one_out and self.otb_tail == "others_mean"
        ):
            _fail(
                f"otb_shrinkage={self.otb_shrinkage!r} shrinks the leave-one-out baseline toward the other members' "
                f"mean, so it needs otb_leave_one_out=True and otb_tail='others_mean' (got otb_leave_one_out="
                f"{self.otb_leave_one_out}, otb_tail={self.otb_tail!r}). Set both, or otb_shrinkage='none'."
            )
        if not self.temperature > 0:
            _fail(
                f"temperature={self.temperature!r}: training samples completions from softmax(z / temperature) and "
                "scores their tokens under that distribution (TRL's log-probs, and OTB's proxy 1 - 2 pi(y) + sum pi^2), "
                "and temperature <= 0 (greedy decoding) has none. Set temperature > 0: 1.0 (TRL's default) samples "
                "the model as it is, lower values (e.g. 0.7) closer to greedy."
            )
        if self.num_generations < 2:
            _fail(
                f"num_generations={self.num_generations}: OTB compares completions of the same prompt, so training "
                "needs at least 2 per group (with 1 it degenerates to plain REINFORCE). Set num_generations >= 2 "
                "(4 is the paper's choice)."
            )
        # num_generations_eval=1 is allowed: evaluation takes no gradient step, and each completion is a singleton
        # group (advantage 0 under the shift-invariant tails and the other estimators, R under "zero" and "none").
        if self.num_generations_eval is not None and self.num_generations_eval < 1:
            _fail(f"num_generations_eval={self.num_generations_eval}: set it to 1 or more (or None: num_generations).")
        estimator = ESTIMATORS[self.advantage_estimator]
        defaults = {f.name: f.default for f in fields(OTBConfig)}
        for option, (name, value) in self._option_fields().items():
            if value != defaults[name] and option not in estimator.options:
                _fail(
                    f"{name}={value!r} has no effect with advantage_estimator={self.advantage_estimator!r}, which "
                    f"takes {self._fields_taken_text()}. Leave {name} at its default ({defaults[name]!r}), or use an "
                    f"estimator that takes it ({[e for e in ESTIMATORS if option in ESTIMATORS[e].options]})."
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


_CHECKPOINTING_DEPRECATION = r"`gradient_checkpointing` is deprecated and will be removed in v6"


def otb_field_names() -> list[str]:
    """The fields OTBConfig declares itself (its own options, and the GRPOConfig fields it redefines), in order."""
    own = vars(OTBConfig).get("__annotations__", {})
    return [f.name for f in fields(OTBConfig) if f.name in own]


@functools.cache
def _accepted_types(name: str) -> tuple[type, ...]:
    """The types field ``name`` takes: its annotation's (``float`` takes an int too), or :data:`_TYPE_OVERRIDES`."""
    if name in _TYPE_OVERRIDES:
        return _TYPE_OVERRIDES[name]
    annotation = get_type_hints(OTBConfig)[name]  # resolves the postponed (string) annotations
    accepted = annotation.__args__ if isinstance(annotation, types.UnionType) else (annotation,)
    # A Literal["a", "b"] takes the types of its values; the values themselves are checked where the field is.
    accepted = [type(v) for a in accepted for v in a.__args__] if get_origin(annotation) is Literal else accepted
    return tuple(t for a in accepted for t in ((int, float) if a is float else (a,)) if isinstance(t, type))


def _type_text(accepted: tuple[type, ...]) -> str:
    names = {bool: "True or False", int: "an integer", float: "a finite number", str: "a string", type(None): "None"}
    shown = [t for t in accepted if not (t is int and float in accepted)]  # a float field takes ints too
    return " or ".join(names.get(t, t.__name__) for t in shown)


def _validate_otb_types(config: OTBConfig) -> None:
    """Every field of :func:`otb_field_names` has a value of its annotated type (a bool is not an int, an int not a
    bool, a number is finite) and lies in its :data:`_RANGES` range; otherwise a ValueError says what to set."""
    for name in otb_field_names():
        value, accepted = getattr(config, name), _accepted_types(name)
        if not accepted:
            continue  # an annotation that names no plain type (e.g. a Protocol): nothing to check by type
        is_bool = isinstance(value, bool)
        ok = isinstance(value, accepted) and (bool in accepted or not is_bool)  # True is an int to Python
        if ok and not is_bool and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            hint = (
                " (a string such as 'no' or 'false' is read as True)"
                if bool in accepted and isinstance(value, str)
                else ""
            )
            _fail(
                f"{name}={value!r} ({type(value).__name__}) is not {_type_text(accepted)}{hint}. Set {name} to "
                f"{_type_text(accepted)}; its default is {_default(name)!r}."
            )
        low, high = _RANGES.get(name, (None, None))
        if (
            value is not None
            and not is_bool
            and ((low is not None and value < low) or (high is not None and value > high))
        ):
            bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
            _fail(f"{name}={value!r} is out of range: set {name} {bounds} (default {_default(name)!r}).")


def _default(name: str):
    return next(f.default for f in fields(OTBConfig) if f.name == name)


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
