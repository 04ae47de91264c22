"""TRL's own ``AsyncGRPOTrainer`` fed by ``NemoGymFeed``: whole NeMo Gym groups with their
versions into TRL's queue, and every TRL weight sync publishing the adapter through
``LoraSync`` (``nemogym_sdk.adapters.trl.async_feed``).

The trainer is TRL 1.16's, built on the tiny model with a peft LoRA. Two things of it need
CUDA: ``get_peak_flops_per_device`` (a telemetry query in its constructor) and the
FlashAttention-3 kernel its tree attention calls, which TRL fetches from the Hugging Face
Hub (``kernels``); ``run_async_grpo_on_cpu`` replaces both for each test (``on_cpu``). The
first test drives TRL's train begin (the cold sync, the worker's start), its data loader
(staleness filter, batcher, tree-packing collator) and its weight sync by hand, to look at
each packed batch; another runs ``trainer.train()`` whole, its loss and optimizer steps
included. The episodes are real: the session's toy deployment (``nemogym_sdk.serve`` and
``target_chars`` behind NeMo Gym's head server).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.policy import SamplingParams
from nemogym_sdk.processes import free_loopback_ports
from tests import warm
from tests.gym.deployment import ToyDeployment
from tests.gym.trl_async import (
    GENERATIONS,
    GROUPS,
    OPTIONS,
    build,
    on_cpu,
    same_terms,
    sample_terms,
    train,
    trained_terms,
)

pytest.importorskip("trl")
pytest.importorskip("peft")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gym,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'"),
    pytest.mark.filterwarnings("ignore:.*checkpointing.*:FutureWarning"),
]


def check_packed(batch: dict[str, Any], samples: list[Any]) -> None:
    """TRL's packed micro-batch trains exactly the samples' policy tokens, with their
    sampler logprobs and advantages."""
    same_terms(trained_terms(batch), sample_terms(samples))


def test_async_grpo_trainer_trains_whole_nemo_gym_groups_and_publishes_each_version(
    toy_deployment: ToyDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's ``AsyncGRPOTrainer`` (`build`): its train begin publishes version 0 and starts the
    feed; its loader packs one engine step per optimizer step, whole groups, with the policy
    tokens, logprobs and advantages the SDK computed; its weight sync publishes version 1,
    after which the next step holds the groups the staleness bound makes due; and what it
    did not train comes back as the feed's leftover."""
    from nemogym_sdk.serve.tiny import save_tiny

    on_cpu(monkeypatch)
    toy, model_path = toy_deployment, str(save_tiny(tmp_path / "model", 0))
    trainer, feed, client, sync = build(
        toy.stack.directory, toy.sampler.base_url, toy.train_file, tmp_path, model_path
    )
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


def test_async_grpo_trainer_train_steps_on_nemo_gym_groups_and_publishes_each_step(
    toy_deployment: ToyDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's ``AsyncGRPOTrainer.train()`` as a user runs it, two optimizer steps
    (on the CPU: ``run_async_grpo_on_cpu``): TRL's loss on the first step
    sees the sampler's own logprobs (ratio 1, KL 0: every old logprob lines up with its
    token through TRL's tree packing), the second trains groups at most one version old,
    the feed's figures reach TRL's logs, each step's adapter is published (versions 0, 1,
    2) and the last equals the trained policy's, and the groups trained are not in the
    leftover."""
    from safetensors.torch import load_file

    from nemogym_sdk.serve.tiny import save_tiny

    on_cpu(monkeypatch)
    toy, model_path = toy_deployment, str(save_tiny(tmp_path / "model", 0))
    trainer, feed, client, sync = build(
        toy.stack.directory, toy.sampler.base_url, toy.train_file, tmp_path, model_path
    )
    steps = train(trainer, feed, client, sync)
    assert [entry["step"] for entry in steps] == [1, 2]
    first, second = steps
    assert first["ratio"] == pytest.approx(1.0, abs=1e-4) and first["kl"] < 1e-6, first
    assert first["sample/staleness_max"] == 0 and second["sample/staleness_max"] <= 1
    assert all(np.isfinite(entry["loss"]) and entry["grad_norm"] > 0 for entry in steps)
    assert first["nemogym/ok_frac"] > 0 and first["batch/samples_per_step"] == GROUPS * GENERATIONS
    assert [record.version for record in sync.history] == [0, 1, 2]
    model = trainer.accelerator.unwrap_model(trainer.model)
    published = load_file(str(Path(sync.history[-1].path) / "adapter_model.safetensors"))
    trained = {
        name.replace(".default", ""): param.detach()
        for name, param in model.named_parameters()
        if "lora_" in name
    }
    assert set(published) == set(trained)
    assert all(torch.equal(published[name], trained[name]) for name in trained)
    assert max(float(w.abs().max()) for n, w in trained.items() if "lora_B" in n) > 0  # moved
    taken = feed.rollout_buffer.taken[: 2 * GROUPS * GENERATIONS]
    assert feed.leftover is not None
    assert not {s.group_id for s in taken} & set(feed.leftover.requeue)


def fake_trainer(feed: Any, *, processes: int = 1, rank: int = 0, **changes: Any) -> Any:
    """What ``attach`` reads of a trainer: one engine step per weight sync by default, and
    the feed on rank 0 only, as TRL keeps it."""
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
    mine = feed if rank == 0 else None
    return SimpleNamespace(
        args=SimpleNamespace(**args),
        accelerator=SimpleNamespace(num_processes=processes, is_main_process=rank == 0),
        callback_handler=SimpleNamespace(callbacks=["trl's"]),
        rollout_worker=mine,
        weight_transfer=mine,
    )


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"token_budget": None}, "token_budget=None"),
        ({"gradient_accumulation_steps": 1}, "consumes 4 samples"),
        ({"weight_sync_steps": 2}, "consumes 16 samples"),
        ({"processes": 2}, "consumes 16 samples .* x 2 processes"),
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


@pytest.mark.parametrize("rank", [0, 1])
def test_attach_on_every_rank_gathers_before_trl_syncs(rank: int) -> None:
    """With two processes a weight sync consumes ``per_device x 2 x accumulation`` samples;
    every rank attaches (TRL keeps the feed on rank 0 only), and the adapter's gather goes
    first among the trainer's callbacks, ahead of TRL's weight syncs."""
    from nemogym_sdk.adapters.trl import NemoGymFeed

    client = SimpleNamespace(sampling=SamplingParams(temperature=1.0))
    feed = NemoGymFeed(client, ["row"], OPTIONS, sync=None, eos_token_id=0)  # type: ignore[arg-type]
    one = fake_trainer(feed, rank=rank)
    feed.attach(one)
    assert one.callback_handler.callbacks == ["trl's"]  # one process: nothing to gather
    two = fake_trainer(feed, processes=2, rank=rank, gradient_accumulation_steps=1)
    feed.attach(two)
    first, rest = two.callback_handler.callbacks[0], two.callback_handler.callbacks[1:]
    assert type(first).__name__ == "GatherBeforeSync" and rest == ["trl's"]


def test_two_ranks_share_each_step_and_rank_0_publishes_the_whole_adapter(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """TRL's ``AsyncGRPOTrainer`` on ``torchrun --nproc_per_node=2``
    (``trl_async_ranks.py``), the policy whole on each rank and then sharded with FSDP2:
    TRL's loader deals each engine step out to the two ranks, which together train exactly
    its policy tokens, whole groups, with the sampler's logprobs and the SDK's advantages;
    the feed runs on rank 0 only; each weight sync publishes the whole adapter (every rank
    gathers a sharded one first), which the sampler serves as the next version; and the
    second step holds the groups the bound makes due. Then ``trainer.train()`` on both
    ranks (data-parallel), its loss and optimizer steps included."""
    from nemogym_sdk.serve.tiny import save_tiny

    toy, (port,) = toy_deployment, free_loopback_ports(1)
    head = toy.stack.directory.head_url
    assert head is not None
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    argv += ["--master_port", str(port), "-m", "tests.gym.trl_async_ranks"]
    argv += ["--head", head, "--sampler", toy.sampler.base_url]
    argv += ["--train-file", str(toy.train_file), "--root", str(tmp_path)]
    argv += ["--model", str(save_tiny(tmp_path / "model", 0))]
    done = warm.run(argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for mode in ("whole", "sharded"):
        rank0, rank1 = (json.loads((tmp_path / mode / f"rank{r}.json").read_text()) for r in (0, 1))
        assert rank0["sharded"] == rank1["sharded"] == (mode == "sharded")
        assert rank0["served_cold"] == 0 and rank0["published_cold"] == 0.0
        assert rank0["served_after_sync"] == 1 and rank0["model_version"] == 2
        assert rank0["published"] < 1e-6, rank0  # the whole adapter, as trained
        step_groups = []
        for mine, theirs in zip(rank0["steps"], rank1["steps"], strict=True):
            assert mine["taken"] == GROUPS * GENERATIONS
            assert mine["sizes"] == [GENERATIONS] * GROUPS  # whole groups
            assert mine["terms"] and theirs["terms"]  # a group for each rank
            same_terms(mine["terms"] + theirs["terms"], mine["want"])
            assert max(mine["staleness"]) <= OPTIONS.max_staleness
            step_groups.append(set(mine["groups"]))
        # the pacing starts four groups on version 0; step 1 holds the two step 0 did not
        assert step_groups[0].isdisjoint(step_groups[1])
        assert step_groups[0] | step_groups[1] == {0, 1, 2, 3}
        assert set(rank0["requeue"]) == set(range(rank0["next_index"])) - step_groups[0]
    # trainer.train() on both ranks: TRL's loss (reduced over the ranks) sees the sampler's
    # logprobs on the first step, and each step's adapter is published
    trained = json.loads((tmp_path / "trained" / "rank0.json").read_text())
    assert trained["versions"] == [0, 1, 2] and [s["step"] for s in trained["steps"]] == [1, 2]
    first, second = trained["steps"]
    assert first["ratio"] == pytest.approx(1.0, abs=1e-4) and first["kl"] < 1e-6, first
    assert first["batch/samples_per_step"] == GROUPS * GENERATIONS
    assert second["sample/staleness_max"] <= OPTIONS.max_staleness
    assert all(step["grad_norm"] > 0 for step in trained["steps"])


def test_the_async_example_runs_as_a_user_runs_it(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """``python examples/trl_async_grpo.py`` (TRL's ``AsyncGRPOTrainer`` through
    ``NemoGymFeed``, on the CPU), attached to the session's deployment as a run on several
    processes would be (starting its own is the same servers, ``start_serve`` and
    ``GymStack``): two steps, each published, the first trained on the sampler's own
    logprobs, the second at most one version stale, every episode OK, the summary written."""
    out, toy = tmp_path / "run", toy_deployment
    example = Path(__file__).resolve().parents[2] / "examples" / "trl_async_grpo.py"
    head = toy.stack.directory.head_url
    assert head is not None
    argv = [sys.executable, str(example), "--steps", "2", "--out", str(out)]
    argv += ["--head-url", head, "--sampler-url", toy.sampler.base_url]
    done = warm.run([*argv, "--train-file", str(toy.train_file)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    first, second = summary["steps"]
    assert summary["published_versions"] == [0, 1, 2]
    assert first["ratio"] == pytest.approx(1.0, abs=1e-4)
    assert second["sample/staleness_max"] <= 1
    assert first["nemogym/ok_frac"] == second["nemogym/ok_frac"] == 1.0
    # every group started was trained (two steps of the example's two) or is left to resume
    assert summary["next_group"] == len(summary["untrained_groups"]) + 2 * 2
    assert "step   2  reward" in done.stdout


def test_the_first_publish_refuses_a_sampler_that_keeps_too_few_versions(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """The session's sampler keeps 4 adapter versions side by side; a feed whose engine may
    run 3 versions behind needs 5: TRL's cold sync publishes version 0, then stops with a
    ``ConfigError`` that says so, before any rollout."""
    from nemogym_sdk.adapters.trl import NemoGymFeed
    from nemogym_sdk.client import AgentClient
    from nemogym_sdk.lora import LoraSync
    from nemogym_sdk.rollout_engine import EngineOptions
    from tests.lora_models import tiny_lora

    model = tiny_lora()
    options = EngineOptions(num_generations=GENERATIONS, groups_per_step=GROUPS, max_staleness=3)
    sync = LoraSync(toy_deployment.sampler.base_url, "policy", tmp_path / "adapters")
    feed = NemoGymFeed(
        AgentClient(toy_deployment.stack.directory), [], options, sync=sync, eos_token_id=0
    )
    feed._trainer = SimpleNamespace(  # what attach binds: the trainer's model
        model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m)
    )
    with sync, pytest.raises(ConfigError, match=r"keeps 4 version.* bound of 3 needs 5"):
        feed.resume()
    assert [record.version for record in sync.history] == [0] and feed._engine is None
