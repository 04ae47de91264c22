"""Route a trainer's weight sync to LoRA adapter sync, through a removable instance hook.

TRL's ``GRPOTrainer`` calls ``trainer.vllm_generation.sync_weights()`` after optimizer
steps; for a LoRA policy served by adapter name that must publish the adapter instead
of merging weights into vLLM. ``install_lora_sync`` sets ``sync_weights`` on that one
**instance** (never its class, so other trainers in the process are untouched), and
``LoraSyncHook.remove()`` puts back exactly what was there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

from nemogym_sdk import ranks
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.lora.sync import LoraSync

__all__ = ["LoraSyncHook", "install_lora_sync"]

logger = logging.getLogger(__name__)

ATTRIBUTE = "sync_weights"
_MISSING = object()


class LoraSyncHook:
    """An installed ``sync_weights`` hook on one generation object; ``remove()`` undoes it."""

    def __init__(self, target: object, hook: Callable[..., None], delegate: str) -> None:
        self.target = target
        """The object the hook is installed on (the trainer's ``vllm_generation``)."""
        self.delegate = delegate
        """What the hook calls: ``trainer._sync_lora_adapter`` or ``LoraSync.sync``."""
        self._hook = hook
        own = getattr(target, "__dict__", None)
        self._original = own.get(ATTRIBUTE, _MISSING) if isinstance(own, dict) else _MISSING
        try:
            setattr(target, ATTRIBUTE, hook)
        except AttributeError as exc:  # __slots__ without sync_weights, or a read-only attribute
            raise ConfigError(
                f"cannot set {ATTRIBUTE} on the {type(target).__name__} instance: {exc}"
            ) from exc
        self._installed = True

    @property
    def installed(self) -> bool:
        """Whether the hook is still in place."""
        return self._installed

    def __call__(self) -> None:
        """Run the hook (what ``target.sync_weights()`` does while installed)."""
        self._hook()

    def remove(self) -> None:
        """Restore the original attribute (delete the instance attribute if there was none).

        Idempotent. If something replaced the hook after it was installed, that is left in
        place (with a warning), since restoring would drop it.
        """
        if not self._installed:
            return
        self._installed = False
        own = getattr(self.target, "__dict__", None)
        current = own.get(ATTRIBUTE, _MISSING) if isinstance(own, dict) else _MISSING
        if current is not self._hook:
            logger.warning(
                "%s.%s was replaced after the LoRA sync hook was installed; leaving it",
                type(self.target).__name__,
                ATTRIBUTE,
            )
            return
        if self._original is _MISSING:
            assert isinstance(own, dict)
            del own[ATTRIBUTE]  # not delattr: mocks record deletions instead of forgetting
        else:
            setattr(self.target, ATTRIBUTE, self._original)

    def __enter__(self) -> LoraSyncHook:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "installed" if self._installed else "removed"
        return f"LoraSyncHook({type(self.target).__name__}.{ATTRIBUTE} -> {self.delegate}, {state})"


def _is_main(trainer: object) -> bool:
    accelerator = getattr(trainer, "accelerator", None)
    flag = getattr(accelerator, "is_main_process", None)
    if isinstance(flag, bool):
        return flag
    return ranks.rank() == 0


def _sync_on_main(trainer: object, sync: LoraSync) -> None:
    """Rank 0 publishes; every rank then learns the outcome (and fails together)."""
    ranks.on_main(lambda: sync.sync(getattr(trainer, "model", None)), is_main=_is_main(trainer))


def install_lora_sync(trainer: object, sync: LoraSync | None = None) -> LoraSyncHook:
    """Make ``trainer.vllm_generation.sync_weights()`` sync the LoRA adapter.

    - If the trainer has its own ``_sync_lora_adapter`` (axolotl's async GRPO trainer;
      every rank calls it), the hook delegates to it and ``sync`` is not used.
    - Otherwise the hook calls ``sync.sync(trainer.model)`` on the main process only
      (``trainer.accelerator.is_main_process``, else rank 0) through
      ``nemogym_sdk.ranks.on_main``: with ``torch.distributed`` initialised every rank
      learns the outcome and raises if the sync failed, so no rank waits forever.

    Raises:
        ConfigError: the trainer has no ``vllm_generation``, or neither a
            ``_sync_lora_adapter`` nor a ``sync`` to call.
    """
    target = getattr(trainer, "vllm_generation", None)
    if target is None:
        raise ConfigError(
            f"{type(trainer).__name__} has no vllm_generation to hook; the trainer must "
            "generate with vLLM in server mode (use_vllm=True, vllm_mode='server')"
        )
    own_sync = getattr(trainer, "_sync_lora_adapter", None)
    if callable(own_sync):
        if sync is not None:
            logger.info("trainer has _sync_lora_adapter; the hook delegates to it, not %r", sync)

        def delegate(*_args: Any, **_kwargs: Any) -> None:
            own_sync()

        return LoraSyncHook(target, delegate, "trainer._sync_lora_adapter")
    if sync is None:
        raise ConfigError(
            f"{type(trainer).__name__} has no _sync_lora_adapter; pass a LoraSync: "
            "install_lora_sync(trainer, LoraSync(base_url, adapter_name, directory))"
        )
    chosen = sync

    def publish(*_args: Any, **_kwargs: Any) -> None:
        _sync_on_main(trainer, chosen)

    return LoraSyncHook(target, publish, "LoraSync.sync")
