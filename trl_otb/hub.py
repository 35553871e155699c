"""Model cards and Hub publishing for OTB runs.

- :func:`preflight_hub` checks, before any training, that a push to the Hub can succeed: the Hub is online, a token
  is there, and the token's user may write to the repo's namespace. Each failure says what to do.
- :func:`otb_card_section` renders the OTB part of a model card (base model, data, OTB settings, accuracy, citations);
  :func:`otb_model_card` makes the trainer write TRL's card with that section appended, both for the final checkpoint
  and for ``trainer.push_to_hub``, which writes the card again before uploading.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["HubPreflightError", "OTB_CITATION", "TRL_CITATION", "otb_card_section", "otb_model_card", "preflight_hub"]

OTB_CITATION = """\
@article{li2026optimal,
    title        = {{The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL}},
    author       = {Li et al.},
    year         = 2026,
    eprint       = {arXiv:2602.07078},
}"""

TRL_CITATION = """\
@software{vonwerra2020trl,
    title        = {{TRL: Transformers Reinforcement Learning}},
    author       = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
    license      = {Apache-2.0},
    url          = {https://github.com/huggingface/trl},
    year         = {2020}
}"""

_SECTION_MARKER = "## Optimal Token Baseline (OTB)"


class HubPreflightError(RuntimeError):
    """A push to the Hub would fail; the message says what to change."""


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE")
    return constants.HF_HUB_OFFLINE or str(flag).upper() in {"1", "ON", "YES", "TRUE"}


def preflight_hub(hub_model_id: str | None, token: str | None = None) -> str:
    """Check that the current token may push to ``hub_model_id``; return the full ``namespace/name`` repo id.

    ``hub_model_id`` without a namespace (or None, read as the output directory's name by the caller) is taken to live
    under the token's user. Raises :class:`HubPreflightError` when the Hub is offline or unreachable, no token is set,
    the token is invalid or read-only, or the namespace is neither the user nor one of the user's organisations.
    """
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    skip = "or drop --push_to_hub to train without publishing"
    if _hub_offline():
        raise HubPreflightError(
            f"--push_to_hub needs the Hugging Face Hub, but HF_HUB_OFFLINE=1 switches it off. Unset HF_HUB_OFFLINE, {skip}."
        )
    token = token or get_token()
    if not token:
        raise HubPreflightError(
            "--push_to_hub needs a Hugging Face token with write access, and none is set. Run `hf auth login`, set "
            f"HF_TOKEN (or pass --hub_token), {skip}."
        )
    try:
        info = HfApi().whoami(token=token)
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status == 401:
            raise HubPreflightError(
                f"The Hugging Face token was rejected (401 Unauthorized). Create a new write token at "
                f"https://huggingface.co/settings/tokens and run `hf auth login`, {skip}."
            ) from err
        raise HubPreflightError(
            f"The Hub answered with an error while checking the token ({err}). Retry later, {skip}."
        ) from err
    except Exception as err:  # connection refused, DNS, timeouts, proxies: the Hub cannot be reached
        raise HubPreflightError(
            f"The Hugging Face Hub could not be reached to check the token ({type(err).__name__}: {err}). Check the "
            f"network connection (and HF_ENDPOINT / proxy settings), {skip}."
        ) from err

    user = info.get("name")
    orgs = {org.get("name") for org in info.get("orgs") or () if org.get("name")}
    access = (info.get("auth") or {}).get("accessToken") or {}
    if access.get("role") == "read":
        raise HubPreflightError(
            f"The Hugging Face token of {user!r} is read-only. Create a token with write access at "
            f"https://huggingface.co/settings/tokens and run `hf auth login`, {skip}."
        )
    name = hub_model_id or ""
    namespace, _, repo = name.rpartition("/")
    namespace = namespace or user
    if not repo:
        raise HubPreflightError("--push_to_hub needs a repository name: pass --hub_model_id <namespace>/<name>.")
    if namespace != user and namespace not in orgs:
        where = f"{user!r}" + (f" or your organisations {sorted(orgs)}" if orgs else "")
        raise HubPreflightError(
            f"You cannot write to {namespace}/{repo}: the token belongs to {user!r}, who is not a member of "
            f"{namespace!r}. Use a repo id under {where} (e.g. --hub_model_id {user}/{repo}), log in with a token of "
            f"a member of {namespace!r}, {skip}."
        )
    return f"{namespace}/{repo}"


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def otb_card_section(
    args,
    *,
    base_model: str,
    dataset_name: str,
    summary: Mapping | None = None,
) -> str:
    """The OTB section of a model card, as Markdown.

    Args:
        args: the run's :class:`~trl_otb.OTBConfig` (estimator, proxy, N, tail, epsilon, leave-one-out, loss).
        base_model: what was trained (a Hub id, or a description such as the embedded model's name).
        dataset_name: the training data.
        summary: optional run results: ``accuracy_before``, ``accuracy_after``, ``eval_samples``, ``steps``,
            ``completion_tokens``, ``wall_time_s``.
    """
    summary = dict(summary or {})
    rows = [
        ("advantage estimator", args.advantage_estimator),
        ("proxy w_t", args.otb_proxy),
        ("group size N (num_generations)", args.num_generations),
        ("tail", args.otb_tail),
        ("epsilon", args.otb_epsilon),
        ("leave-one-out", args.otb_leave_one_out),
        ("loss_type", args.loss_type),
        ("KL beta", args.beta),
        ("max_completion_length", args.max_completion_length),
        ("learning_rate", args.learning_rate),
    ]
    lines = [
        _SECTION_MARKER,
        "",
        f"This model is **{base_model}** fine-tuned with GRPO using the Optimal Token Baseline "
        "([arXiv 2602.07078](https://arxiv.org/abs/2602.07078)): `trl_otb.OTBTrainer`, a subclass of TRL's "
        f"`GRPOTrainer`, on **{dataset_name}**.",
        "",
        "| OTB setting | value |",
        "|---|---|",
        *(f"| {key} | `{value}` |" for key, value in rows),
    ]
    if summary:
        n = summary.get("eval_samples")
        lines += [
            "",
            "### Results",
            "",
            f"Held-out pass@1 (greedy decoding{f', {n} prompts' if n else ''}), scored by `trl_otb.rewards.accuracy_reward`:",
            "",
            "| | accuracy |",
            "|---|---|",
            f"| before training | {_fmt(summary.get('accuracy_before'))} |",
            f"| after training | {_fmt(summary.get('accuracy_after'))} |",
        ]
        extra = [
            ("training steps", summary.get("steps")),
            ("completion tokens generated in training", summary.get("completion_tokens")),
            ("wall time (s)", summary.get("wall_time_s")),
        ]
        extra = [(k, v) for k, v in extra if v is not None]
        if extra:
            lines += ["", *(f"- {key}: {_fmt(value)}" for key, value in extra)]
    lines += [
        "",
        "### Citations",
        "",
        "Optimal Token Baseline:",
        "",
        "```bibtex",
        OTB_CITATION,
        "```",
        "",
        "TRL:",
        "",
        "```bibtex",
        TRL_CITATION,
        "```",
        "",
    ]
    return "\n".join(lines)


def _append_section(readme: Path, section: str) -> None:
    text = readme.read_text() if readme.exists() else ""
    text = text.split(_SECTION_MARKER)[0].rstrip()  # a re-written card gets the section once
    readme.write_text(f"{text}\n\n{section}" if text else section)


@contextlib.contextmanager
def otb_model_card(trainer, section: str) -> Iterator[None]:
    """While active, every card ``trainer`` writes (``create_model_card``, ``push_to_hub``) ends with ``section``.

    ``push_to_hub`` regenerates README.md from TRL's template before uploading, so appending once is not enough.

    Example::

        with otb_model_card(trainer, otb_card_section(args, base_model=..., dataset_name=...)):
            trainer.create_model_card(dataset_name=...)
            trainer.push_to_hub(dataset_name=...)
    """
    create = trainer.create_model_card

    def create_with_section(*args, **kwargs):
        create(*args, **kwargs)
        if trainer.is_world_process_zero():
            _append_section(Path(trainer.args.output_dir) / "README.md", section)

    trainer.create_model_card = create_with_section
    try:
        yield
    finally:
        del trainer.create_model_card  # back to the class's method
