"""LoRA weight sync: get each new adapter to the inference server NeMo Gym samples from.

The policy reaches the sampler as a LoRA adapter, by name:

- ``probe_lora_support(url)`` reads what the server offers (``/openapi.json``,
  ``/v1/models``) without loading anything;
- ``check_served_name(deployment, name)`` checks that NeMo Gym's model servers request
  the adapter's name (or every rollout samples the base model);
- ``LoraSync(url, name, directory)`` publishes version 0 before the first rollout
  (``initialize``) and a new version after every optimizer step (``sync``), confirms
  each through ``/v1/models`` and raises on any failure;
- ``install_lora_sync(trainer, sync)`` routes a trainer's ``sync_weights`` there;
- ``nemogym_sdk.lora.callback.LoraSyncCallback`` (imports transformers) does both for a
  ``transformers.Trainer`` (TRL, axolotl): version 0 at ``on_train_begin``, one per step.

This is the io layer: it imports requests; torch and peft are imported only inside the
functions that save an adapter. See ``docs/lora-sync.md``.
"""

from __future__ import annotations

from nemogym_sdk.errors import LoraSyncError
from nemogym_sdk.lora.hooks import LoraSyncHook, install_lora_sync
from nemogym_sdk.lora.probe import (
    ENABLE_RUNTIME_LORA,
    LoraCapabilities,
    probe_lora_support,
)
from nemogym_sdk.lora.served_name import check_served_name
from nemogym_sdk.lora.sync import LoraSync, SyncRecord

__all__ = [
    "ENABLE_RUNTIME_LORA",
    "LoraCapabilities",
    "LoraSync",
    "LoraSyncError",
    "LoraSyncHook",
    "SyncRecord",
    "check_served_name",
    "install_lora_sync",
    "probe_lora_support",
]
