"""Thin adapters from nemogym_sdk's primitives to training frameworks.

Each adapter imports its framework only when it is imported itself, and fails with an
``ImportError`` naming the pip extra when the framework is missing:

- `nemogym_sdk.adapters.torch`: per-token logprobs, GRPO-family policy losses and a
  ``train_step`` for a hand-written PyTorch loop (``pip install 'nemogym-sdk[torch]'``).
- `nemogym_sdk.adapters.trl`: TRL's ``GRPOTrainer`` with NeMo Gym: ``make_rollout_func``,
  ``nemo_gym_reward``, ``make_verify_reward``, ``LoraSyncCallback``
  (``pip install 'nemogym-sdk[trl]'``).
- `nemogym_sdk.adapters.axolotl`: ``NemoGymPlugin`` for axolotl's YAML ``plugins:``, and the
  reward functions ``nemo_gym_env_reward`` / ``nemo_gym_verify_reward``
  (``pip install 'nemogym-sdk[axolotl]'``; the plugin class itself imports without axolotl).
"""
