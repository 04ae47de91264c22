"""Named LoRA adapters on one base model (PEFT), as vLLM's runtime LoRA routes serve them.

``LoraAdapters`` owns the module requests run on: the base model while no adapter is
loaded, a ``PeftModel`` around it while some are. ``active(name)`` yields the module with
that adapter switched on (or, for ``None``, with adapters disabled: the base model);
``load`` / ``unload`` back ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` with
vLLM's error messages.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemogym_sdk.serve._deps import require_serve_deps
from nemogym_sdk.serve.errors import BadRequestError, NotFoundError

__all__ = ["LoraAdapters"]

logger = logging.getLogger(__name__)


class LoraAdapters:
    """The LoRA adapters loaded on ``base``, by name."""

    def __init__(self, base: Any) -> None:
        self._base = base
        self._peft: Any = None
        self._paths: dict[str, str] = {}

    @property
    def module(self) -> Any:
        """The module requests run on: the base model, or the PEFT model around it."""
        return self._base if self._peft is None else self._peft

    @property
    def paths(self) -> dict[str, str]:
        """Loaded adapters: name -> the path they were loaded from."""
        return dict(self._paths)

    @contextlib.contextmanager
    def active(self, adapter: str | None) -> Iterator[Any]:
        """The module with ``adapter`` on (``None``: every adapter off, the base model)."""
        if adapter is not None and adapter not in self._paths:
            raise NotFoundError(f"The model `{adapter}` does not exist.", param="model")
        if self._peft is None:
            yield self._base
        elif adapter is None:
            with self._peft.disable_adapter():
                yield self._peft
        else:
            self._peft.set_adapter(adapter)
            yield self._peft

    def load(self, name: str, path: str, *, replace: bool = False) -> None:
        """Load a PEFT LoRA adapter directory under ``name`` (``replace`` reloads in place)."""
        require_serve_deps(extra=("peft",))
        from peft import PeftConfig, PeftModel

        if name in self._paths and not replace:
            raise BadRequestError(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                param="lora_name",
                err_type="InvalidUserInput",
            )
        directory = Path(path)
        if not (directory / "adapter_config.json").is_file():
            raise NotFoundError(f"No adapter found for {path}", param="lora_path")
        try:
            PeftConfig.from_pretrained(str(directory))
        except Exception as error:  # any parse failure is the caller's bad input
            raise BadRequestError(f"Invalid LoRA adapter at {path}: {error}") from error
        if name in self._paths:
            self._drop(name)
        try:
            with warnings.catch_warnings():
                # peft 0.21 calls a transformers API deprecated in 5.x; not actionable here.
                warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(
                        self._base, str(directory), adapter_name=name, is_trainable=False
                    ).eval()
                else:
                    self._peft.load_adapter(str(directory), adapter_name=name, is_trainable=False)
        except Exception as error:  # PEFT raises many types for bad weights
            raise BadRequestError(f"Failed to load LoRA adapter '{name}': {error}") from error
        self._paths[name] = str(path)
        logger.info("loaded LoRA adapter %r from %s", name, path)

    def unload(self, name: str) -> None:
        """Remove the adapter ``name``; the base model is untouched."""
        if name not in self._paths:
            raise NotFoundError(f"The lora adapter '{name}' cannot be found.", param="lora_name")
        self._drop(name)
        logger.info("unloaded LoRA adapter %r", name)

    def _drop(self, name: str) -> None:
        remaining = [other for other in self._paths if other != name]
        if not remaining:
            # PEFT cannot run with zero adapters: strip the LoRA layers, keep the base weights.
            self._base = self._peft.unload().eval()
            self._peft = None
        else:
            self._peft.set_adapter(remaining[0])  # deleting the active adapter would warn
            self._peft.delete_adapter(name)
        del self._paths[name]
