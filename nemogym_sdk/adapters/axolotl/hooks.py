"""axolotl's plugin protocol, as no-op methods, so the plugin needs no axolotl to import.

axolotl (0.19) loads a plugin by dotted path and instantiates it with no arguments
(``axolotl.integrations.base.load_plugin``); its ``PluginManager`` then calls every hook
below on every registered plugin, duck-typed: nothing checks for ``BasePlugin``. Defining
the whole protocol here (same names, same parameters, same neutral return values as
``BasePlugin``) keeps ``NemoGymPlugin`` importable, constructible and testable where
axolotl is not installed; a test in axolotl's venv checks that every public method of
``BasePlugin`` is matched here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AxolotlPluginHooks"]


class AxolotlPluginHooks:
    """Every hook axolotl's ``PluginManager`` calls, doing nothing."""

    def register(self, cfg: Any) -> None:
        """The raw YAML dict, before validation, on every rank."""

    def on_config_validation_error(self, cfg: Any) -> None:
        """Undo ``register``'s side effects after axolotl rejected the config."""

    def get_input_args(self) -> str | None:
        """Dotted path of the pydantic model of the plugin's YAML keys."""
        return None

    def get_training_args_mixin(self) -> str | None:
        """Dotted path of a dataclass mixed into the training arguments."""
        return None

    def get_adapter_capabilities(self) -> list[Any]:
        """Adapters the plugin contributes."""
        return []

    def get_lora_config_kwargs(self, cfg: Any) -> dict[str, Any]:
        """Extra ``LoraConfig`` keyword arguments."""
        return {}

    def load_adapter(
        self, model: Any, cfg: Any, inference: bool = False, config_only: bool = False
    ) -> Any:
        """Load a plugin adapter instead of axolotl's loader (None: not ours)."""
        return None

    def load_datasets(self, cfg: Any, preprocess: bool = False) -> Any:
        """The training set (a ``TrainDatasetMeta``), or None to let axolotl load ``datasets``."""
        return None

    def pre_model_load(self, cfg: Any) -> None:
        """Before the model is loaded."""

    def post_model_build(self, cfg: Any, model: Any) -> None:
        """After the model is built, before adapters."""

    def pre_lora_load(self, cfg: Any, model: Any) -> None:
        """Before LoRA weights are loaded."""

    def post_lora_load(self, cfg: Any, model: Any) -> None:
        """After LoRA weights are loaded."""

    def post_model_load(self, cfg: Any, model: Any) -> None:
        """After the model (with adapters) is loaded."""

    def get_trainer_cls(self, cfg: Any) -> Any:
        """A trainer class to use instead of axolotl's (None: axolotl's)."""
        return None

    def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
        """After the trainer is built, before training."""

    def get_training_args(self, cfg: Any) -> dict[str, Any] | None:
        """Keyword arguments merged into the trainer's arguments before they are built."""
        return None

    def get_collator_cls_and_kwargs(self, cfg: Any, is_eval: bool = False) -> Any:
        """A collator class and its keyword arguments (None: axolotl's)."""
        return None

    def create_optimizer(self, cfg: Any, trainer: Any) -> Any:
        """An optimizer (None: axolotl's)."""
        return None

    def create_lr_scheduler(
        self, cfg: Any, trainer: Any, optimizer: Any, num_training_steps: int
    ) -> Any:
        """A learning-rate scheduler (None: axolotl's)."""
        return None

    def add_callbacks_pre_trainer(self, cfg: Any, model: Any) -> list[Any]:
        """Callbacks for the trainer's arguments."""
        return []

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        """Callbacks added once the trainer exists."""
        return []

    def on_rollouts_scored(
        self,
        cfg: Any,
        trainer: Any,
        prompts: list[str],
        completions: list[str],
        rewards: dict[str, list[float]],
        advantages: list[float],
    ) -> None:
        """After online RL rollouts are scored."""

    def post_train(self, cfg: Any, model: Any) -> None:
        """After training."""

    def post_train_unload(self, cfg: Any) -> None:
        """After training, once the model is unloaded."""
