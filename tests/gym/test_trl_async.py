"""TRL's own ``AsyncGRPOTrainer`` fed by ``NemoGymFeed``: whole NeMo Gym groups with their
versions into TRL's queue, and every TRL weight sync publishing the adapter through
``LoraSync`` (``nemogym_sdk.adapters.trl.async_feed``).

The trainer is TRL 1.16's, built on the tiny model with a peft LoRA, and runs its own train
begin (the cold sync, the worker's start), its own data loader (staleness filter, batcher,
tree-packing collator) and its own weight sync. Two things of it need CUDA and are not run on
this machine: ``get_peak_flops_per_device`` (a telemetry query in its constructor, replaced
here by a constant) and the loss, whose tree attention is a FlashAttention-3 kernel that
TRL fetches from the Hugging Face Hub (``kernels``): it has not run in this project. The
episodes are real: the session's toy deployment (``nemogym_sdk.serve`` and ``target_chars``
behind NeMo Gym's head server).
"""

from __future__ import annotations

import queue
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nemogym_sdk.client import AgentClient
from nemogym_sdk.data import load_rows
from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.policy import SamplingParams
from nemogym_sdk.rollout_engine import EngineOptions
from tests.gym.deployment import ToyDeployment

pytest.importorskip("trl")
pytest.importorskip("peft")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gym,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'"),
    pytest.mark.filterwarnings("ignore:.*checkpointing.*:FutureWarning"),
]

GENERATIONS, GROUPS = 4, 2
OPTIONS = EngineOptions(
    num_generations=GENERATIONS, groups_per_step=GROUPS, max_staleness=1, seed=0
)


class Taken(queue.Queue[Any]):
    """The feed's queue, remembering what the trainer took from it."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[Any] = []

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.taken.append(item)
        return item


def build(toy: ToyDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from peft import LoraConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

    from nemogym_sdk.adapters.trl import NemoGymFeed, make_dataset, sampling_from_args
    from nemogym_sdk.serve.tiny import build_tiny_tokenizer, save_tiny

    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda *_: 1.0)
    rows, directory = load_rows(toy.train_file)[:3], toy.stack.directory
    tokenizer, model_path = build_tiny_tokenizer(), str(save_tiny(tmp_path / "model", 0))
    sampler_url, adapters = toy.sampler.base_url, tmp_path / "adapters"
    cpu: dict[str, Any] = {"use_cpu": True, "bf16": False, "dtype": "float32"}
    # --8<-- [start:config]
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=4,  # x gradient_accumulation_steps: one engine step
        gradient_accumulation_steps=2,
        token_budget=0,  # batches by count
        max_staleness=1,
        report_to=[],
        **cpu,
    )
    options = EngineOptions(num_generations=4, groups_per_step=2, max_staleness=1, seed=0)
    # --8<-- [end:config]
    # --8<-- [start:feed]
    client = AgentClient(directory, sampling=sampling_from_args(args))
    sync = LoraSync(sampler_url, "policy", adapters)
    feed = NemoGymFeed(client, rows, options, sync=sync, eos_token_id=tokenizer.eos_token_id)
    trainer = AsyncGRPOTrainer(
        model_path,
        args=args,
        train_dataset=make_dataset(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        rollout_worker=feed,
        weight_transfer=feed,
    )
    feed.attach(trainer)  # checks the cadence; the model whose adapter it publishes
    # --8<-- [end:feed]
    assert options == OPTIONS
    feed.rollout_buffer = trainer.rollout_queue = Taken()  # before the loader reads it
    return trainer, feed, client, sync


def check_packed(batch: dict[str, Any], samples: list[Any]) -> None:
    """TRL's packed micro-batch trains exactly the samples' policy tokens, with their
    sampler logprobs and advantages."""
    want_labels, want_logps, want_adv = [], [], []
    for sample in samples:
        trained = np.flatnonzero(sample.completion_mask)
        want_labels += sample.input_ids[trained].tolist()
        want_logps += sample.old_log_probs[trained].tolist()
        want_adv += [sample.advantage] * len(trained)
    index = batch["token_index"][batch["token_index"] >= 0]
    labels = batch["shift_labels"][0][index].tolist()
    logps = batch["old_log_probs"][batch["token_index"] >= 0].tolist()
    advantages = batch["advantages"][batch["token_index"] >= 0].tolist()
    got = np.array(sorted(zip(labels, logps, advantages, strict=True)))
    want = np.array(sorted(zip(want_labels, want_logps, want_adv, strict=True)))
    assert got.shape == want.shape and got.shape[0] > 0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_async_grpo_trainer_trains_whole_nemo_gym_groups_and_publishes_each_version(
    toy_deployment: ToyDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's ``AsyncGRPOTrainer`` (`build`): its train begin publishes version 0 and starts the
    feed; its loader packs one engine step per optimizer step, whole groups, with the policy
    tokens, logprobs and advantages the SDK computed; its weight sync publishes version 1,
    after which the next step holds the groups the staleness bound makes due; and what it
    did not train comes back as the feed's leftover."""
    trainer, feed, client, sync = build(toy_deployment, tmp_path, monkeypatch)
    try:
        trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)
        assert sync.served_version() == 0 and trainer.model_version == 1  # the cold sync
        loader = iter(trainer.get_train_dataloader())
        step0 = [next(loader) for _ in range(GROUPS)]  # one optimizer step's micro-batches
        per_step = GROUPS * GENERATIONS
        taken0 = feed.rollout_buffer.taken[:per_step]  # accelerate fetches a batch ahead
        assert len(taken0) == per_step
        for batch, start in zip(step0, range(0, len(taken0), GENERATIONS), strict=True):
            check_packed(batch, taken0[start : start + GENERATIONS])
        by_group: dict[int, list[Any]] = {}
        for sample in taken0:
            by_group.setdefault(sample.group_id, []).append(sample)
        # whole groups: the first two to finish of the four the pacing lets start at once
        assert len(by_group) == GROUPS and set(by_group) < {0, 1, 2, 3}
        for members in by_group.values():
            assert len(members) == GENERATIONS
            assert all(s.model_version == 1 for s in members)  # sampled by version 0
            ok = [s for s in members if s.completion_mask.any()]
            assert len(ok) >= 2, members
            assert sum(s.advantage for s in members) == pytest.approx(0.0, abs=1e-4)
            for s in ok:  # policy tokens carry the sampler's logprobs; the rest is context
                trained = s.completion_mask.astype(bool)
                assert len(s.input_ids) == len(trained) == len(s.old_log_probs)
                assert (s.old_log_probs[trained] < 0).all()
                assert (s.old_log_probs[~trained] == 0).all()
        # the completion starts with the policy's first token; what follows untrained is the
        # environment's (target_chars answers every tool call)
        env_tokens = [
            int((s.completion_mask[int(np.argmax(s.completion_mask)) :] == 0).sum())
            for s in taken0
            if s.completion_mask.any()
        ]
        assert max(env_tokens) > 0, env_tokens
        assert set(by_group) <= trainer._trained_groups  # (and what accelerate fetched ahead)

        # what an optimizer step would have changed, then TRL's own weight sync
        model = trainer.accelerator.unwrap_model(trainer.model)
        lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n)
        with torch.no_grad():
            lora_b.add_(0.5)
        trainer._sync_weight()
        assert trainer.model_version == 2 and sync.served_version() == 1
        assert sync.history[-1].version == 1

        step1 = [next(loader) for _ in range(GROUPS)]
        taken1 = feed.rollout_buffer.taken[per_step : 2 * per_step]
        assert len(taken1) == per_step
        # step 1 must hold every group started on version 0 (max_staleness 1): the other two
        assert {s.group_id for s in taken1} == {0, 1, 2, 3} - set(by_group)
        assert all(trainer.model_version - s.model_version <= OPTIONS.max_staleness for s in taken1)
        for batch, start in zip(step1, range(0, len(taken1), GENERATIONS), strict=True):
            check_packed(batch, taken1[start : start + GENERATIONS])
    finally:
        feed.stop()
        client.close()
        sync.close()
    leftover = feed.leftover
    assert leftover is not None
    # step 0 was trained (a weight sync followed it); step 1 and whatever was played or
    # fetched ahead was not: a resumed run plays all of it again, and nothing else
    assert set(leftover.requeue) == set(range(leftover.next_index)) - set(by_group)


def fake_trainer(feed: Any, **changes: Any) -> SimpleNamespace:
    args = dict(
        token_budget=0,
        per_device_train_batch_size=GENERATIONS,
        gradient_accumulation_steps=GROUPS,
        weight_sync_steps=1,
        num_generations=GENERATIONS,
        max_staleness=1,
        temperature=1.0,
        top_p=1.0,
    )
    args.update(changes)
    return SimpleNamespace(
        args=SimpleNamespace(**args),
        accelerator=SimpleNamespace(num_processes=1),
        rollout_worker=feed,
        weight_transfer=feed,
    )


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"token_budget": None}, "token_budget=None"),
        ({"gradient_accumulation_steps": 1}, "consumes 4 samples"),
        ({"weight_sync_steps": 2}, "consumes 16 samples"),
        ({"num_generations": 8}, "num_generations=8"),
        ({"max_staleness": 0}, "max_staleness=0"),
        ({"temperature": 0.7}, "temperature=0.7"),
    ],
)
def test_attach_refuses_a_trainer_that_would_break_the_pacing(
    changes: dict[str, Any], says: str
) -> None:
    from nemogym_sdk.adapters.trl import NemoGymFeed

    client = SimpleNamespace(sampling=SamplingParams(temperature=1.0))
    feed = NemoGymFeed(client, ["row"], OPTIONS, sync=None, eos_token_id=0)  # type: ignore[arg-type]
    feed.attach(fake_trainer(feed))  # the right cadence passes
    with pytest.raises(ConfigError, match=says):
        feed.attach(fake_trainer(feed, **changes))
    with pytest.raises(UsageError, match="rollout_worker=feed"):
        feed.attach(fake_trainer(NemoGymFeed(client, ["row"], OPTIONS, sync=None, eos_token_id=0)))  # type: ignore[arg-type]
