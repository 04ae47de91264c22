"""TRL's own ``GRPOTrainer`` trains through real NeMo Gym with nemogym_sdk's TRL adapter.

The trainer is built by ``examples/trl_grpo.py`` (``servers`` + ``build_trainer``), in
this process, so the test can look inside: the tiny model with a peft LoRA, TRL's
``rollout_func`` from ``make_rollout_func``, the toy environment ``target_chars`` on real
NeMo Gym servers found through their head server, and ``nemogym_sdk.serve`` serving the
adapter by its name, synced after every optimizer step by ``LoraSyncCallback``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from nemogym_sdk.gym import SDK_ENVS_DIR
from tests import warm
from tests.require import absent

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gym,
    pytest.mark.slow,
    # transformers 5 renames gradient checkpointing; TRL still calls the old names
    pytest.mark.filterwarnings("ignore:.*checkpointing.*:FutureWarning"),
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "trl_grpo.py"
GENERATIONS = 4


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_rows(stack_rows: Path, path: Path) -> list[dict[str, Any]]:
    """Four rows that all share one prompt; the third one's task is broken (num_rounds 0),
    so the environment refuses it and its rollouts fail."""
    good = [json.loads(line) for line in stack_rows.read_text().splitlines()[:3]]
    broken = {**good[2], "num_rounds": 0}
    rows = [good[0], good[1], broken, {**good[2], "seed": 99}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def probe_logit_gradients(trainer: Any, inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Backpropagate TRL's own loss on ``inputs``; per completion token, the size of the
    gradient reaching the final hidden state that predicts it, with TRL's masks.

    TRL scores tokens with a fused LM head (the logits never exist as a tensor), so the
    probe sits on the last norm's output: after the last layer nothing mixes positions,
    so the hidden state at position i feeds only the logprob of token i+1.
    """
    outputs: list[Any] = []

    def keep(_module: Any, _args: Any, output: Any) -> None:
        if output.requires_grad:
            output.retain_grad()
            outputs.append(output)

    final_norm = trainer.model.get_base_model().model.norm  # the tiny Llama's
    handle = final_norm.register_forward_hook(keep)
    try:
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, inputs).backward()
    finally:
        handle.remove()
    completion_mask, tool_mask = inputs["completion_mask"], inputs["tool_mask"]
    width = completion_mask.shape[1]
    grads = torch.cat([out.grad for out in outputs], dim=0)  # chunks over rows, in order
    assert grads.shape[0] == completion_mask.shape[0]
    # position i predicts token i+1: the last width+1 positions cover the completion
    per_token = grads[:, -(width + 1) : -1].abs().sum(-1)
    return per_token, completion_mask, tool_mask


def test_grpo_trainer_on_real_nemo_gym(gym_venv: object, tmp_path: Path) -> None:
    """Three optimizer steps of TRL's GRPOTrainer on real NeMo Gym:

    - rows that share one prompt each play their own task (by row id) and all train;
    - the broken row's rollouts fail and are unscorable: TRL's logged reward mean equals the
      OK rollouts' mean (not diluted by zeros), and TRL gives them advantage 0;
    - the served adapter version is 0 before training and advances by one every step;
    - a gradient probe of TRL's loss: exactly zero gradient reaches the logits of
      environment tokens, while policy tokens get gradient;
    - with ``report_to=["tensorboard"]`` the SDK's ``nemo_gym/*`` rollout metrics reach
      TensorBoard's event file through TRL's own log, equal to what TRL logged.
    """
    example = load_example()
    out = tmp_path / "run"
    train = tmp_path / "train.jsonl"
    argv = ["--steps", "3", "--rows-per-step", "2", "--num-generations", str(GENERATIONS)]
    tensorboard = importlib.util.find_spec("tensorboard") is not None
    argv += ["--report-to", "tensorboard" if tensorboard else "none"]
    args = example.parse_args([*argv, "--out", str(out), "--train-file", str(train)])
    with example.servers(args) as env:
        write_rows(SDK_ENVS_DIR / "target_chars" / "data" / "train.jsonl", train)
        trainer, rollout_func, callback = example.build_trainer(args, env)
        recorder = example.StepRecorder(rollout_func, callback.sync)
        trainer.add_callback(recorder)
        with rollout_func:
            trainer.train()

            # --- steps, versions -------------------------------------------------------------
            assert trainer.state.global_step == 3
            assert [r.version for r in callback.records] == [0, 1, 2, 3]
            assert [s["served_version"] for s in recorder.steps] == [1, 2, 3]
            assert rollout_func.calls == 3

            # --- rows by id: every step plays 2 rows x 4; all 4 rows (one prompt) get played ----
            ids = [r.row_id for step in recorder.rollouts for r in step]
            names = {row.row_id for row in rollout_func.rows.values()}
            assert set(ids) == names, "a row sharing the prompt was never played"
            for step in recorder.rollouts:
                counts: dict[str, int] = {}
                for rollout in step:
                    counts[str(rollout.row_id)] = counts.get(str(rollout.row_id), 0) + 1
                assert sorted(counts.values()) == [GENERATIONS, GENERATIONS]

            # --- failures are unscorable, not zeros ------------------------------------------
            broken = f"{train}:3"
            logged = [e for e in trainer.state.log_history if "loss" in e]
            saw_failure = False
            for step, log, rollouts in zip(recorder.steps, logged, recorder.rollouts, strict=True):
                failed = [r for r in rollouts if not r.ok]
                assert {str(r.row_id) for r in failed} <= {broken}
                if failed:
                    saw_failure = True
                    assert len(failed) == GENERATIONS
                    assert step["statuses"].get("agent_error") == GENERATIONS, step
                    assert log["nemo_gym/ok_fraction"] == pytest.approx(0.5)
                ok_rewards = [r.reward for r in rollouts if r.ok]
                assert log["reward"] == pytest.approx(sum(ok_rewards) / len(ok_rewards), abs=1e-5)
            assert saw_failure, "the broken row was never drawn"
            # --- gradient probe: environment tokens carry no gradient ------------------------
            # one group of a good row and one of the broken row, through TRL's own scoring
            dataset = trainer.train_dataset
            by_id = {dataset[i]["nemo_gym_row_id"]: dict(dataset[i]) for i in range(len(dataset))}
            # distinct dicts: TRL writes each completion's extra fields into its own input row
            batch = [dict(by_id[row]) for row in [f"{train}:1", broken] for _ in range(GENERATIONS)]
            inputs = trainer._generate_and_score_completions(batch)
            advantages = inputs["advantages"]
            assert torch.isfinite(advantages).all()
            assert (advantages[GENERATIONS:] == 0).all()  # unscorable: no advantage
            assert (advantages[:GENERATIONS] != 0).any()
            per_token, completion_mask, tool_mask = probe_logit_gradients(trainer, inputs)
            env_tokens = (completion_mask == 1) & (tool_mask == 0)
            policy_tokens = (completion_mask == 1) & (tool_mask == 1)
            assert env_tokens.sum() > 0 and policy_tokens.sum() > 0
            assert float(per_token[env_tokens].max()) == 0.0
            assert float(per_token[policy_tokens].max()) > 0.0

    # --- report_to: the SDK's metrics through TRL's log, in TensorBoard's event file ---------
    if not tensorboard:
        absent("tensorboard is not installed (pip install 'nemogym-sdk[trackers]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = (out / "trainer" / "runs").iterdir()
    events = EventAccumulator(str(run_dir))
    events.Reload()
    read = events.Scalars("train/nemo_gym/ok_fraction")
    assert [e.step for e in read] == [1, 2, 3]
    for event, log in zip(read, logged, strict=True):
        assert event.value == pytest.approx(log["nemo_gym/ok_fraction"], rel=1e-6)
    assert "train/nemo_gym/failures/agent_error" in events.Tags()["scalars"]


def test_example_script_runs(gym_venv: object, tmp_path: Path) -> None:
    """``python examples/trl_grpo.py`` as a user runs it: two steps, adapter v1 then v2
    served, every rollout OK, summary written."""
    out = tmp_path / "run"
    argv = [sys.executable, str(EXAMPLE), "--steps", "2", "--out", str(out)]
    done = warm.run(argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["global_step"] == 2
    assert summary["sync_versions"] == [0, 1, 2]
    assert [step["served_version"] for step in summary["steps"]] == [1, 2]
    assert all(step["statuses"] == {"ok": 8} for step in summary["steps"])
    assert "step   2" in done.stdout
