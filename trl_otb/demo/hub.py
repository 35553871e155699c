"""Publishing OTB runs on the Hugging Face Hub.

:func:`preflight_hub` checks, before any training, that a push to the Hub can succeed: the Hub is online, a token is
there, and the token's user may write to the repo's namespace. Each failure says what to do.
:func:`hub_offline` (whether the Hub is switched off) and :func:`hub_cached` (whether a model is in the local Hub
cache) live in :mod:`trl_otb.models`, which loads models by them; they are re-exported here.
"""

from __future__ import annotations

from ..models import hub_cached, hub_offline

__all__ = [
    "HubPreflightError",
    "hub_cached",
    "hub_offline",
    "preflight_hub",
]


class HubPreflightError(RuntimeError):
    """A push to the Hub would fail; the message says what to change."""


def preflight_hub(hub_model_id: str | None, token: str | None = None) -> str:
    """Check that the current token may push to ``hub_model_id``; return the full ``namespace/name`` repo id.

    ``hub_model_id`` without a namespace (or None, read as the output directory's name by the caller) is taken to live
    under the token's user. Raises :class:`HubPreflightError` when the Hub is offline or unreachable, no token is set,
    the token is invalid or read-only, or the namespace is neither the user nor one of the user's organisations.
    """
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    skip = "or drop --push_to_hub to train without publishing"
    if hub_offline():
        raise HubPreflightError(
            "--push_to_hub needs the Hugging Face Hub, but HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1) switches it off. "
            f"Unset HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE), {skip}."
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
