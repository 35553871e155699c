"""The demo's model loading: :mod:`trl_otb.models`, where the library keeps it, under the demo's name.

The examples and notebooks import these names from here; ``trl-otb fidelity`` imports them from the library.
"""

from __future__ import annotations

from ..models import (
    EMBEDDED_ALIASES,
    EMBEDDED_HUB_ID,
    EMBEDDED_MODEL_NAME,
    EmbeddedModelUnavailableError,
    ModelNotAvailableError,
    default_cache_dir,
    embedded_gguf_path,
    embedded_model_path,
    ensure_pad_token,
    is_embedded_checkpoint,
    load_model_and_tokenizer,
    load_tokenizer,
    quantization_config,
    resolve_model,
)

__all__ = [
    "EMBEDDED_ALIASES",
    "EMBEDDED_HUB_ID",
    "EMBEDDED_MODEL_NAME",
    "EmbeddedModelUnavailableError",
    "ModelNotAvailableError",
    "default_cache_dir",
    "embedded_gguf_path",
    "embedded_model_path",
    "ensure_pad_token",
    "is_embedded_checkpoint",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "quantization_config",
    "resolve_model",
]
