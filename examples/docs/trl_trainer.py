"""TRL's GRPOTrainer on NeMo Gym: the lines ``docs/trl.md`` shows, run against stand-ins.

The two sections between ``--8<--`` markers are what a TRL user adds to a ``GRPOTrainer``
script (the page shows them). Around them, so that this runs on a CPU in seconds without
NeMo Gym: a fake NeMo Gym agent (``nemogym_sdk.testing.fake_agent``) that answers every row
with a one-turn episode, a stand-in head server that lists it and a model server asking the
sampler for ``policy``, ``nemogym_sdk.serve``'s tiny model as that sampler, and a two-row
``train.jsonl``. The same lines against real NeMo Gym servers: ``examples/trl_grpo.py``.
"""

import contextlib
import json
import os
import random
import tempfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from nemogym_sdk.serve import (
    CausalLMBackend,
    ServeEngine,
    ServerThread,
    build_tiny_model,
    build_tiny_tokenizer,
)
from nemogym_sdk.testing import fake_agent
from nemogym_sdk.testing.fake_agent import serve_routes

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

# --8<-- [start:imports]
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from nemogym_sdk import ServerDirectory, load_rows  # 1
from nemogym_sdk.adapters.trl import (  # 2
    LoraSyncCallback,
    make_dataset,
    make_rollout_func,
    nemo_gym_reward,
)
from nemogym_sdk.lora import LoraSync  # 3

# --8<-- [end:imports]


def play(row: Any) -> dict[str, Any]:
    """The stand-in agent's ``/run``: one model turn (tiny-model token ids), a random reward."""
    turn = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "hi"}],
        "prompt_token_ids": [257, 117, 115, 101, 114],
        "generation_token_ids": [104, 105, 258],
        "generation_log_probs": [-5.5, -5.5, -5.5],
    }
    return {"response": {"output": [turn]}, "reward": random.random()}


def head_config(agent_url: str, sampler_url: str) -> dict[str, Any]:
    """The global config a head server would serve: the agent, and NeMo Gym's model server
    requesting ``policy`` (the adapter's name) from the sampler."""
    agent = urlsplit(agent_url)
    return {
        "my_agent": {
            "responses_api_agents": {"simple_agent": {"host": agent.hostname, "port": agent.port}}
        },
        "policy_model": {
            "responses_api_models": {"vllm_model": {"base_url": sampler_url, "model": "policy"}}
        },
    }


@contextlib.contextmanager
def stand_ins() -> Iterator[tuple[str, str]]:
    """The fake agent, a head server that lists it, the tiny model as the sampler, and a
    two-row ``train.jsonl`` in a temporary working directory; yields (head, sampler) URLs."""
    previous = os.getcwd()
    with (
        tempfile.TemporaryDirectory() as workdir,
        fake_agent(play) as agent,
        ServerThread(ServeEngine(CausalLMBackend.tiny())) as sampler,
    ):
        config = head_config(agent.url, sampler.base_url)

        async def global_config(request: web.Request) -> web.Response:
            return web.json_response(config)

        async def server_instances(request: web.Request) -> web.Response:
            return web.json_response([])  # none listed: hosts and ports come from the config

        routes = [
            web.get("/global_config_dict_yaml", global_config),
            web.get("/server_instances", server_instances),
        ]
        with serve_routes(routes) as head:
            os.chdir(workdir)
            with open("train.jsonl", "w") as rows_file:
                for word in ("abc", "xyz"):
                    prompt = [{"role": "user", "content": f"Reply with {word}."}]
                    rows_file.write(json.dumps({"responses_create_params": {"input": prompt}}))
                    rows_file.write("\n")
            try:
                yield head, sampler.base_url
            finally:
                os.chdir(previous)


with stand_ins() as (HEAD, SAMPLER):
    model, tokenizer = build_tiny_model(), build_tiny_tokenizer()
    # --8<-- [start:trainer]
    # model, tokenizer: yours; HEAD: NeMo Gym's head server ("gym-head:11000"); SAMPLER: the
    # sampler NeMo Gym's model server asks for model "policy" ("http://sampler:8000/v1")
    deployment = ServerDirectory.from_head(HEAD)  # 4: NeMo Gym's head server
    rows = load_rows("train.jsonl")  # 5: NeMo Gym JSONL, rows with stable ids
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=GRPOConfig(
            output_dir="out", temperature=1.0, num_generations=4, max_steps=1, use_cpu=True
        ),
        peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
        train_dataset=make_dataset(rows),  # 6: prompts carry their row's id
        rollout_func=make_rollout_func(deployment, rows),  # 7: NeMo Gym plays each row
        reward_funcs=[nemo_gym_reward],  # 8: the environment's reward
    )
    sync = LoraSync(SAMPLER, "policy", "adapters")  # 9: the server NeMo Gym samples from
    trainer.add_callback(LoraSyncCallback(sync, deployment=deployment))  # 10
    trainer.train()
    # --8<-- [end:trainer]
    trainer.rollout_func.close()
    assert sync.served_version() == 1, sync.history  # version 0 before the step, 1 after
