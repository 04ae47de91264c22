"""Real axolotl: its own CLI loads ``NemoGymPlugin`` from ``examples/axolotl_nemo_gym.yaml``
and trains a LoRA policy for 3 GRPO steps on CPU against real NeMo Gym servers.

The test process (main venv) starts ``nemogym_sdk.serve`` (sampling the tiny model, serving
the adapter ``policy``) and NeMo Gym's servers for ``target_chars`` with a head server, and
writes the same tiny model for axolotl to load. Then, from axolotl's own venv
(``.venv-axolotl``, as an axolotl user has it; ``make axolotl-venv`` builds it)::

    axolotl train examples/axolotl_nemo_gym.yaml --launcher python \\
        --base-model=<tiny model> --output-dir=<tmp> --dataloader-num-workers=4

with ``$NEMOGYM_HEAD_URL`` and ``$NEMOGYM_SAMPLER_URL`` naming this run's servers: the
example YAML itself is what runs. ``--dataloader-num-workers=4`` checks that the plugin's 0
reaches the trainer's arguments.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.require import absent

REPO = Path(__file__).resolve().parents[2]
AXOLOTL_VENV = REPO / ".venv-axolotl"
AXOLOTL = AXOLOTL_VENV / "bin" / "axolotl"
EXAMPLE = REPO / "examples" / "axolotl_nemo_gym.yaml"
STEPS = 3


@pytest.fixture(autouse=True)
def _axolotl_venv() -> None:
    if not AXOLOTL.exists():
        absent(f"{AXOLOTL_VENV} is absent (make axolotl-venv builds it); real-axolotl test skipped")


def _axolotl_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    env.update(AXOLOTL_DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PATH"] = f"{AXOLOTL_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _train_logs(output: str) -> list[dict[str, Any]]:
    """The per-step dicts the trainer printed (``{'loss': ...}``)."""
    return [ast.literal_eval(m) for m in re.findall(r"\{'loss': [^{}]*\}", output)]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train(tmp_path: Path, config: Path, versions: int) -> tuple[str, Path, list[Any]]:
    """Run ``axolotl train config`` against real NeMo Gym (target_chars) and
    ``nemogym_sdk.serve`` keeping ``versions`` adapter versions; (its output, its output
    directory, the sampler's model cards at the end)."""
    from nemogym_sdk.gym import GymStack, GymVenvNotFoundError, find_gym_venv, start_serve
    from nemogym_sdk.serve.tiny import save_tiny

    try:
        venv = find_gym_venv()
    except GymVenvNotFoundError as exc:
        absent(f"NeMo Gym venv absent, real-server test skipped: {exc}")
    model_dir = save_tiny(tmp_path / "model", seed=0)
    out = tmp_path / "out"
    with start_serve(
        mode="sample",
        logprobs_mode="processed_logprobs",
        seed=0,
        extra_args=["--adapter-versions", str(versions)],
        log_path=tmp_path / "serve.log",
    ) as backend:
        policy = backend.policy_model("policy")
        with GymStack(
            ["target_chars"], policy, venv=venv, head_server=True, workdir=tmp_path / "gym"
        ) as stack:
            assert stack.directory.head_url is not None
            env = _axolotl_env()
            env["NEMOGYM_HEAD_URL"] = stack.directory.head_url
            env["NEMOGYM_SAMPLER_URL"] = backend.base_url
            argv = [str(AXOLOTL), "train", str(config), "--launcher", "python"]
            argv += [f"--base-model={model_dir}", f"--output-dir={out}"]
            argv += ["--dataloader-num-workers=4"]
            began = time.monotonic()
            done = subprocess.run(
                argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
            )
            seconds = time.monotonic() - began
            output = done.stdout + done.stderr
            if done.returncode != 0:
                pytest.fail(
                    f"axolotl exited {done.returncode} after {seconds:.0f} s:\n{output[-6000:]}"
                )
            models = requests.get(f"{backend.base_url}/models", timeout=10).json()["data"]
    print(f"axolotl train: {seconds:.1f} s")
    return output, out, models


def _check_run(output: str, out: Path, models: list[Any]) -> list[dict[str, Any]]:
    """What every agent-mode run must show; returns the rollout log's lines."""
    assert "Plugin loaded successfully: nemogym_sdk.adapters.axolotl.NemoGymPlugin" in output
    startup = json.loads((out / "nemo_gym" / "startup.json").read_text())
    assert startup["trainer"] == "AxolotlAsyncGRPOTrainer"
    assert startup["data_producer"] == "NemoGymDataProducer"
    assert startup["dataloader_num_workers"] == 0  # the CLI asked for 4
    assert startup["reward_funcs"] == ["nemo_gym_env_reward"]
    assert startup["reward_weights"] == [1.0]
    assert set(startup["agents"]) == {"target_chars_agent"}

    logs = _train_logs(output)
    print("train logs:", [(log["loss"], log["reward"]) for log in logs])
    assert len(logs) == STEPS
    for log in logs:
        assert float(log["grad_norm"]) > 0
        assert 0.0 < float(log["rewards/nemo_gym_env_reward/mean"]) < 1.0
        # the plugin's rollout metrics, in the trainer's own log (what report_to receives)
        assert float(log["nemo_gym/ok_fraction"]) == 1.0  # printed as strings
        assert float(log["nemo_gym/turns_mean"]) == 3.0

    rollouts = _jsonl(out / "nemo_gym" / "rollouts.jsonl")
    print("rollouts:", rollouts)
    assert [r["step"] for r in rollouts] == list(range(STEPS))
    for line in rollouts:
        assert line["rollouts"] == 8 and line["groups"] == 2 and line["ok"] == 8
        assert line["agents"] == {"target_chars_agent": 8}
        assert line["turns_mean"] == 3.0  # target_chars plays three rounds
        assert line["unversioned_tokens"] == 0  # the sampler said which version, every turn
    syncs = _jsonl(out / "nemo_gym" / "syncs.jsonl")
    print("syncs:", syncs)
    assert [(s["step"], s["version"], s["served_version"]) for s in syncs] == [
        (step, step, step) for step in range(1, STEPS + 1)
    ]
    served = {card["id"]: card.get("root") for card in models}
    assert str(served["policy"]).endswith(f"v{STEPS:06d}")
    return rollouts


@pytest.mark.gym
@pytest.mark.slow
def test_axolotl_trains_with_the_plugin_against_real_nemo_gym(tmp_path: Path) -> None:
    """axolotl loads the plugin from the YAML; 3 optimizer steps run, each on 8 rollouts (2
    rows x 4) that NeMo Gym's target_chars agent played for 3 turns; after every step the
    sampler serves the next adapter version; the trainer ran with 0 dataloader workers and
    one NeMo Gym reward. Each batch is played when asked: on the learner's own version."""
    rollouts = _check_run(*_train(tmp_path, EXAMPLE, versions=1))
    assert [line["staleness"] for line in rollouts] == [
        {"0": line["policy_tokens"]} for line in rollouts
    ]


@pytest.mark.gym
@pytest.mark.slow
def test_axolotl_trains_asynchronously_from_the_rollout_engine(tmp_path: Path) -> None:
    """The same YAML with ``nemo_gym_max_staleness: 1``: the producer draws whole groups from
    a ``RolloutEngine`` that keeps playing while axolotl learns (the sampler keeps 3 adapter
    versions); some batches were sampled one version behind the learner, none more, and
    every turn's version came back from the sampler."""
    config = tmp_path / "async.yaml"
    config.write_text(EXAMPLE.read_text() + "\nnemo_gym_max_staleness: 1\nuse_tensorboard: true\n")
    output, out, models = _train(tmp_path, config, versions=3)
    rollouts = _check_run(output, out, models)
    _check_tensorboard(out, rollouts)
    assert json.loads((out / "nemo_gym" / "startup.json").read_text())["max_staleness"] == 1
    for line in rollouts:
        assert set(line["staleness"]) <= {"0", "1"}, line["staleness"]
        assert line["engine_group_age_max"] <= 1
    assert any(line["staleness"].get("1", 0) > 0 for line in rollouts)


def _check_tensorboard(out: Path, rollouts: list[dict[str, Any]]) -> None:
    """``use_tensorboard: true``: the rollout metrics reach TensorBoard's event file
    through the trainer's log, one value per step, each batch's own (float32)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        absent("tensorboard is not installed here (pip install 'nemogym-sdk[trackers]')")
    (run_dir,) = (out / "runs").iterdir()
    events = EventAccumulator(str(run_dir))
    events.Reload()
    read = events.Scalars("train/nemo_gym/staleness_mean")
    assert [e.step for e in read] == list(range(1, STEPS + 1))
    want = [line["staleness_mean"] for line in rollouts]
    assert [e.value for e in read] == pytest.approx(want, rel=1e-6)


def test_plugin_matches_axolotls_plugin_protocol() -> None:
    """Every public method of axolotl's BasePlugin exists on NemoGymPlugin with the same
    parameters (PluginManager calls them all, duck-typed), checked in axolotl's own venv."""
    code = """
import inspect, json
from axolotl.integrations.base import BasePlugin
from nemogym_sdk.adapters.axolotl import NemoGymPlugin
problems = []
for name, member in inspect.getmembers(BasePlugin, inspect.isfunction):
    if name.startswith("_"):
        continue
    ours = getattr(NemoGymPlugin, name, None)
    if ours is None:
        problems.append(f"missing {name}")
        continue
    want = list(inspect.signature(member).parameters)
    got = list(inspect.signature(ours).parameters)
    if want != got:
        problems.append(f"{name}: {got} != {want}")
print(json.dumps(problems))
"""
    done = subprocess.run(
        [str(AXOLOTL_VENV / "bin" / "python"), "-c", code],
        cwd=REPO,
        env=_axolotl_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
