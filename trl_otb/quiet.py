"""Warnings TRL's own code raises that a user cannot act on, silenced one message at a time (every other warning,
and the same warning from the user's own code outside OTBTrainer's calls, still shows).

TRL 1.16 calls transformers' deprecated ``gradient_checkpointing*`` aliases (``gradient_checkpointing_enable``,
``gradient_checkpointing_disable``, ``is_gradient_checkpointing``) around every generation, so a run would print
their ``FutureWarning`` s although nothing in the user's code uses them. (The config's own ``gradient_checkpointing``
field, which TRL sets by default, is handled in ``OTBConfig.__post_init__``.)
"""

from __future__ import annotations

import contextlib
import warnings

__all__ = ["CHECKPOINTING_ALIASES", "quiet_checkpointing_aliases"]

CHECKPOINTING_ALIASES = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated and will be removed in v6"
"""The message (a regex from its start) transformers warns with when one of the aliases is called."""


@contextlib.contextmanager
def quiet_checkpointing_aliases():
    """Inside: transformers' FutureWarning for the deprecated checkpointing aliases is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CHECKPOINTING_ALIASES, category=FutureWarning)
        yield
