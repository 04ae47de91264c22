"""NeMo Gym environments in axolotl GRPO runs: ``NemoGymPlugin`` and its reward functions.

An axolotl YAML lists the plugin and exactly one of the two reward functions::

    rl: grpo
    adapter: lora
    plugins:
      - nemogym_sdk.adapters.axolotl.NemoGymPlugin
    nemo_gym_datasets:
      - path: data/train.jsonl
    nemo_gym_multi_turn: true              # rollouts through NeMo Gym agents
    trl:
      reward_funcs:
        - nemogym_sdk.adapters.axolotl.nemo_gym_env_reward

Agent mode (``nemo_gym_multi_turn: true``) replaces the trainer's generation with rollouts
through NeMo Gym's agents and publishes the LoRA adapter to the inference server after
every optimizer step; verify mode scores the trainer's own completions with
``nemo_gym_verify_reward``. See ``docs/axolotl.md`` and ``examples/axolotl_nemo_gym.yaml``.

This package imports neither axolotl nor torch: the plugin's hooks import them when they
run and raise ``ImportError`` naming ``pip install 'nemogym-sdk[axolotl]'`` when missing.
"""

from __future__ import annotations

from nemogym_sdk.adapters.axolotl.plugin import NemoGymPlugin
from nemogym_sdk.adapters.axolotl.rewards import (
    impute_failed,
    nemo_gym_env_reward,
    nemo_gym_verify_reward,
)
from nemogym_sdk.adapters.axolotl.settings import (
    DatasetSpec,
    NemoGymSettings,
    apply_config_defaults,
)

__all__ = [
    "DatasetSpec",
    "NemoGymPlugin",
    "NemoGymSettings",
    "apply_config_defaults",
    "impute_failed",
    "nemo_gym_env_reward",
    "nemo_gym_verify_reward",
]
