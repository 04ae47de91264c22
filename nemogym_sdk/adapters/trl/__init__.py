"""NeMo Gym in TRL's ``GRPOTrainer``: a rollout function, reward functions, LoRA sync.

What a TRL user adds::

    from nemogym_sdk import ServerDirectory, load_rows
    from nemogym_sdk.adapters.trl import (
        LoraSyncCallback, make_dataset, make_rollout_func, nemo_gym_reward)
    from nemogym_sdk.lora import LoraSync

    deployment = ServerDirectory.from_head("127.0.0.1:11000")
    rows = load_rows("train.jsonl")
    trainer = GRPOTrainer(
        model, args=GRPOConfig(...), peft_config=LoraConfig(...),
        train_dataset=make_dataset(rows),                      # prompts carry row ids
        rollout_func=make_rollout_func(deployment, rows),      # NeMo Gym plays the rows
        reward_funcs=[nemo_gym_reward],                        # None for failed rollouts
    )
    trainer.add_callback(LoraSyncCallback(
        LoraSync(sampler_url, "policy", "adapters"), deployment=deployment))

- `make_dataset`: rows as a ``datasets.Dataset`` whose prompts carry each row's id.
- `make_rollout_func`: TRL's ``rollout_func``; plays each prompt's row once through its
  NeMo Gym agent, at the trainer's temperature and ``top_p``, and returns ``prompt_ids``,
  ``completion_ids``, ``logprobs``, ``env_mask`` and the extra fields ``env_reward``,
  ``num_turns``, ``status``.
- `nemo_gym_reward`: the environment's reward, ``None`` (TRL's "unscorable") for a failed
  rollout; `make_verify_reward`: ``/verify`` scores for single-turn training.
- `LoraSyncCallback` (from `nemogym_sdk.lora.callback`): publishes the adapter to the
  sampler before training and after each optimizer step.
- `NemoGymFeed`: TRL's asynchronous ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``)
  instead: its ``rollout_worker`` and ``weight_transfer``, whole groups from a
  ``RolloutEngine`` and each version published through ``LoraSync``;
  `run_async_grpo_on_cpu` lets that trainer run without a GPU (to try a pipeline).

Needs ``trl>=1.6,<2`` (checked on import): ``pip install 'nemogym-sdk[trl]'``.
"""

from __future__ import annotations

from nemogym_sdk.adapters.trl._compat import (
    MAX_TRL_EXCLUSIVE,
    MIN_TRL,
    TESTED_TRL,
    UnsupportedTRLError,
    check_trl_version,
    import_trl,
)

import_trl()

from nemogym_sdk.adapters.trl.async_feed import NemoGymFeed  # noqa: E402
from nemogym_sdk.adapters.trl.cpu import CpuVarlenAttention, run_async_grpo_on_cpu  # noqa: E402
from nemogym_sdk.adapters.trl.dataset import ROW_ID_KEY, make_dataset, prompt_row_id  # noqa: E402
from nemogym_sdk.adapters.trl.rewards import (  # noqa: E402
    TRLVerifyReward,
    make_verify_reward,
    nemo_gym_reward,
)
from nemogym_sdk.adapters.trl.rollout import (  # noqa: E402
    NemoGymRolloutFunc,
    make_rollout_func,
    sampling_from_args,
    to_trl_output,
)
from nemogym_sdk.lora.callback import LoraSyncCallback  # noqa: E402

__all__ = [
    "CpuVarlenAttention",
    "LoraSyncCallback",
    "MAX_TRL_EXCLUSIVE",
    "MIN_TRL",
    "NemoGymFeed",
    "NemoGymRolloutFunc",
    "ROW_ID_KEY",
    "TESTED_TRL",
    "TRLVerifyReward",
    "UnsupportedTRLError",
    "check_trl_version",
    "make_dataset",
    "make_rollout_func",
    "make_verify_reward",
    "nemo_gym_reward",
    "prompt_row_id",
    "run_async_grpo_on_cpu",
    "sampling_from_args",
    "to_trl_output",
]
