"""Play rollouts on a NeMo Gym deployment that runs elsewhere, found through its head server.

python examples/docs/remote_gym.py http://gym-host:11000 data/train.jsonl --eos-token-id 2
"""

import argparse

from nemogym_sdk import AgentClient, ServerDirectory, load_rows
from nemogym_sdk.lora import check_served_name

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("head_url", help="NeMo Gym's head server, e.g. http://gym-host:11000")
parser.add_argument("train_file", help="NeMo Gym JSONL rows the deployment's agents can play")
parser.add_argument("--eos-token-id", type=int, required=True, help="the policy's EOS token")
parser.add_argument("--sampler-url", help="check that NeMo Gym's model server asks it for...")
parser.add_argument("--adapter-name", default="policy", help="...this model name")
args = parser.parse_args()

directory = ServerDirectory.from_head(args.head_url, wait=120)  # waits for /readyz
print("agents:", sorted(directory.agents))
print("resources servers:", sorted(directory.resources_servers))
if args.sampler_url:  # a ConfigError naming both fixes when the names differ
    check_served_name(directory, args.adapter_name, backend_url=args.sampler_url)

rows = load_rows(args.train_file, max_samples=2, seed=0)
with AgentClient(directory) as client:
    rollouts = client.run_sync(rows, eos_token_id=args.eos_token_id, num_generations=4)
for r in rollouts:
    print(r.agent_name, r.status.value, f"turns={r.num_turns} reward={r.reward:.2f}")
