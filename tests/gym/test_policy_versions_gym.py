"""The version channel through real NeMo Gym: per model turn, the adapter version the
rollout records is the one the sampler served, while new versions are published in the
middle of episodes (``nemogym_sdk.serve`` keeps 8 side by side, pinned; ``target_chars``
plays three model turns per episode through NeMo Gym's own model server and agent)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nemogym_sdk import AgentClient, LoraSync, SamplingParams, load_rows
from nemogym_sdk.gym import GymStack, start_serve
from nemogym_sdk.serve.record import read_records, turn_key
from nemogym_sdk.wire import decode_run_result
from tests.lora_models import perturb, tiny_lora

pytestmark = [pytest.mark.gym, pytest.mark.slow]

KEPT = 8
"""Adapter versions the sampler keeps side by side (an episode spans a few publishes)."""
ROUNDS = 5
"""Rounds of 6 rows x 4 generations at most."""


def test_every_turn_records_the_version_that_served_it(gym_venv: object, tmp_path: Path) -> None:
    """Episodes play while a thread publishes a new adapter every 0.3 s. Each turn's
    recorded version equals the sampler's own record of that generation (joined by the
    turn's token ids); pinned, an episode keeps its first turn's version; and some episodes
    did span a publish."""
    record = tmp_path / "served.jsonl"
    extra = ["--adapter-versions", str(KEPT), "--version-policy", "pinned", "--record", str(record)]
    model = tiny_lora()
    with (
        start_serve(
            mode="sample", seed=0, extra_args=extra, log_path=tmp_path / "serve.log", fork=True
        ) as sampler,
        GymStack(
            ["target_chars"], sampler.policy_model("policy"), workdir=tmp_path / "gym"
        ) as stack,
        LoraSync(sampler.base_url, "policy", tmp_path / "adapters", keep=KEPT) as sync,
        AgentClient(stack.directory, sampling=SamplingParams(temperature=1.0)) as client,
    ):
        sync.initialize(model)
        published: list[tuple[float, int]] = [(time.monotonic(), 0)]
        stop = threading.Event()

        def publish() -> None:
            seed = 0
            while not stop.wait(0.3):
                seed += 1
                perturb(model, seed, scale=0.2)
                version = sync.sync(model).version
                published.append((time.monotonic(), version))

        rows = load_rows(stack.train_paths["target_chars"], seed=0)
        publisher = threading.Thread(target=publish)
        publisher.start()
        raws = []
        try:  # rounds of 6 rows until 2 versions came out while playing (the batched
            # sampler can play a round in less than one publish interval)
            for start in range(0, 6 * ROUNDS, 6):
                raws += client.run_raw_sync(rows[start : start + 6], num_generations=4)
                if len(published) >= 3:
                    break
        finally:
            stop.set()
            publisher.join()
        # the same episodes through the parser: the versions a Rollout keeps
        rollouts = [raw.rollout(eos_token_id=2) for raw in raws]

    served = read_records(record)
    spanned = 0
    for raw, rollout in zip(raws, rollouts, strict=True):
        result = decode_run_result(raw.body)
        assert rollout.ok and len(result.turns) == 3, rollout.error
        recorded = tuple(turn.version for turn in result.turns)
        assert rollout.turn_versions == recorded
        for turn in result.turns:
            key = turn_key(turn.prompt_ids.tolist(), turn.generation_ids.tolist())  # type: ignore[union-attr]
            assert served[key]["version"] == turn.version  # what the sampler says it ran
        # pinned: the version it started on, for as long as the sampler keeps it
        assert all(v == recorded[0] or v >= recorded[0] + KEPT for v in recorded), recorded
        last = max(
            float(served[turn_key(t.prompt_ids.tolist(), t.generation_ids.tolist())]["time"])  # type: ignore[union-attr,arg-type]
            for t in result.turns
        )
        first = min(
            float(served[turn_key(t.prompt_ids.tolist(), t.generation_ids.tolist())]["time"])  # type: ignore[union-attr,arg-type]
            for t in result.turns
        )
        if any(first < t < last for t, _ in _wall(published)):
            spanned += 1
    assert len(published) >= 3, published  # several versions were published while playing
    assert spanned > 0  # some episodes played on across a publish, on their own version


def _wall(published: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """Publish times on the recorder's clock (``time.time``)."""
    offset = time.time() - time.monotonic()
    return [(t + offset, v) for t, v in published]
