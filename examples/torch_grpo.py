"""GRPO on a real NeMo Gym environment in a plain PyTorch loop, written from nemogym_sdk's parts.

A LoRA adapter on the SDK's tiny random Llama learns the toy environment ``target_chars``
(three rounds; reward = the share of lowercase letters); ``nemogym_sdk.serve`` samples the
adapter by its name. ``nemogym-train`` (``nemogym_sdk/train/recipe.py``) is the same recipe with
everything around it (vLLM, torchrun, prefetch, checkpoints, plots)::

    python examples/torch_grpo.py --steps 20 --out runs/torch_grpo   # needs `make gym-venv`
"""

import argparse
import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from nemogym_sdk import (
    AgentClient,
    LoraSync,
    SamplingParams,
    check_served_name,
    collate,
    compute_advantages,
    load_rows,
)
from nemogym_sdk.adapters.torch import PolicyLoss, train_step
from nemogym_sdk.gym import GymStack, start_serve
from nemogym_sdk.metrics import RolloutStats
from nemogym_sdk.serve.tiny import build_tiny_model, build_tiny_tokenizer

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", type=Path, default=Path("runs/torch_grpo"))
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

tokenizer = build_tiny_tokenizer()
torch.manual_seed(0)  # peft draws LoRA's A from the global RNG; B starts at zero
lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
model = get_peft_model(build_tiny_model(seed=0), lora)  # the sampler builds the same weights
optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-2)
sampling = SamplingParams(temperature=1.0)  # what the sampler samples, the learner corrects for
loss = PolicyLoss(loss_type="dapo")

with (
    start_serve(mode="sample", logprobs_mode="processed_logprobs", seed=0) as sampler,
    GymStack(["target_chars"], sampler.policy_model("policy"), workdir=args.out / "gym") as stack,
    LoraSync(sampler.base_url, "policy", args.out / "adapters") as sync,
    AgentClient(stack.directory, sampling=sampling) as client,
    (args.out / "metrics.jsonl").open("w") as metrics,
):
    check_served_name(stack.directory, "policy", backend_url=sampler.base_url)
    sync.initialize(model)  # version 0 (= the base model) before the first rollout
    rows = load_rows(stack.train_paths["target_chars"], seed=0)
    for step in range(args.steps):
        # --8<-- [start:step]  (docs/training.md shows one step)
        picked = [rows[(4 * step + i) % len(rows)] for i in range(4)]  # 4 groups of 8
        rollouts = client.run_sync(picked, eos_token_id=tokenizer.eos_token_id, num_generations=8)
        batch = collate(rollouts, pad_token_id=tokenizer.pad_token_id)
        advantages = compute_advantages(batch)  # per group of a row; failures get 0
        learner = train_step(model, optimizer, batch, advantages, loss=loss, sampling=sampling)
        version = sync.sync(model).version  # the next rollouts sample the new adapter
        # --8<-- [end:step]
        line = {"step": step, **RolloutStats.of(batch, advantages).as_metrics()}
        line |= {**learner.as_dict(), "adapter_version": version}
        line["served_version"] = sync.served_version()  # read back from /v1/models
        metrics.write(json.dumps(line) + "\n")
        print(
            f"step {step:3d}  reward {line['reward_mean']:.3f}  mismatch max "
            f"{learner.mismatch_max:.1e}  adapter v{version}",
            flush=True,
        )
