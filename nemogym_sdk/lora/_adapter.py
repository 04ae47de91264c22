"""The PEFT side of LoRA sync: save the active adapter, check that it starts at zero.

torch and peft are imported inside these functions only, so ``nemogym_sdk.lora`` (and
``LoraSync.push``) work without them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from nemogym_sdk import _extras
from nemogym_sdk.errors import ConfigError

__all__ = ["first_nonzero_lora_b", "gather_adapter", "is_sharded", "save_adapter"]

_YOURSELF = "or save the adapter yourself and publish it with LoraSync.push(path)"
_B_WEIGHTS = ("lora_B", "lora_embedding_B")


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        absent = _extras.missing(("torch", "peft")) or ["peft"]
        hint = _extras.needs("saving a PEFT adapter", absent, "torch", instead=_YOURSELF)
        raise ImportError(hint) from exc
    return peft


def peft_model(model: object) -> Any:
    """``model`` as a ``peft.PeftModel``, unwrapping DDP-style ``.module`` wrappers."""
    peft = _peft()
    candidate = model
    for _ in range(4):
        if isinstance(candidate, peft.PeftModel):
            return candidate
        candidate = getattr(candidate, "module", None)
        if candidate is None:
            break
    raise ConfigError(
        f"expected a peft.PeftModel with a LoRA adapter, got {type(model).__name__}; build it "
        "with peft.get_peft_model(model, LoraConfig(...)), or pass the unwrapped model "
        "(accelerator.unwrap_model(model))"
    )


def active_adapter(model: Any) -> str:
    """The one active adapter of a PeftModel, which must be a LoRA adapter."""
    active = model.active_adapter
    if isinstance(active, (list, tuple)):
        if len(active) != 1:
            raise ConfigError(
                f"the model has {len(active)} active adapters {list(active)}; activate exactly "
                "one with model.set_adapter(name) before syncing"
            )
        active = active[0]
    config = model.peft_config.get(active)
    peft_type = str(getattr(getattr(config, "peft_type", None), "value", config))
    if peft_type != "LORA":
        raise ConfigError(
            f"adapter {active!r} is a {peft_type} adapter; vLLM serves LoRA adapters only"
        )
    return str(active)


def save_adapter(model: object, directory: Path, *, state_dict: Any = None) -> str:
    """Save the active LoRA adapter of ``model`` into ``directory``; return its path.

    PEFT writes an adapter that is not called ``default`` into a subdirectory named after
    it; the returned path is wherever ``adapter_config.json`` ended up. ``state_dict``
    is a full (gathered) state dict for sharded models (FSDP, ZeRO-3).
    """
    peft_instance = peft_model(model)
    active = active_adapter(peft_instance)
    with warnings.catch_warnings():
        # peft 0.21 calls a transformers API deprecated in 5.x; not actionable here.
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        peft_instance.save_pretrained(
            str(directory),
            selected_adapters=[active],
            safe_serialization=True,
            **({} if state_dict is None else {"state_dict": state_dict}),
        )
    for candidate in (directory, directory / active):
        if (candidate / "adapter_config.json").is_file():
            return str(candidate)
    raise ConfigError(f"peft wrote no adapter_config.json under {directory}")


def is_sharded(model: object) -> bool:
    """Whether ``model`` is sharded with FSDP2 (each rank holds a slice of every weight)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gather_adapter(model: object) -> dict[str, Any] | None:
    """A sharded model's trainable weights (its adapter) in full, as CPU tensors on rank 0
    and empty on the others: a collective every rank calls, for ``save_adapter``'s
    ``state_dict``. None for a model that is whole on this rank (its own weights serve)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return dict(get_model_state_dict(model, options=options))  # type: ignore[arg-type]


def first_nonzero_lora_b(model: object, *, state_dict: Any = None) -> tuple[str, float] | None:
    """The first nonzero ``lora_B`` weight of the active adapter, as (name, max |w|).

    ``None`` when every B weight is exactly zero (PEFT's default init: the adapter equals
    the base model). ``state_dict``: the model's gathered full state dict, read instead of
    its parameters (a sharded model's are slices).
    Raises ``ConfigError`` when the adapter has no B weights at all.
    """
    _peft()
    import torch

    peft_instance = peft_model(model)
    active = active_adapter(peft_instance)
    weights = peft_instance.named_parameters() if state_dict is None else state_dict.items()
    seen = 0
    with torch.no_grad():
        for name, param in weights:
            parts = name.split(".")
            if not any(
                part in _B_WEIGHTS and parts[i + 1 : i + 2] == [active]
                for i, part in enumerate(parts)
            ):
                continue
            seen += 1
            values = param.detach()
            if values.numel() and bool(values.ne(0).any()):
                return name, float(values.abs().max())
    if seen == 0:
        raise ConfigError(f"adapter {active!r} has no lora_B weights; is it a LoRA adapter?")
    return None
