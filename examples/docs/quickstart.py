"""Quickstart: play rollouts of the toy environment `target_chars` on real NeMo Gym, on a CPU."""

from nemogym_sdk import AgentClient, load_rows
from nemogym_sdk.gym import GymStack, start_serve

with (
    start_serve() as model,  # a tiny random model on loopback: no GPU, no download
    GymStack(["target_chars"], model.policy_model()) as stack,  # real NeMo Gym servers
    AgentClient(stack.directory) as client,
):
    rows = load_rows(stack.train_paths["target_chars"], max_samples=2, seed=0)
    rollouts = client.run_sync(rows, eos_token_id=258, num_generations=4)  # 258: the EOS id
for r in rollouts:  # row ids are "<file>:<line>"
    print(r.row_id.rsplit("/", 1)[-1], r.status.value, f"turns={r.num_turns} reward={r.reward:.2f}")
