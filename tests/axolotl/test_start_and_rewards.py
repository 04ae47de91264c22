"""Start-up checks and reward wiring, against loopback NeMo Gym servers.

The head server (``tests.axolotl.fakes.head_server``) describes agents and resources servers
that are real loopback servers (``tests.fakes``), so discovery, ``/run`` and ``/verify`` are
real HTTP. The trainer is a stand-in with the attributes the plugin reads (axolotl is not
installed in this venv); ``test_real_axolotl`` runs the real one.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemogym_sdk import ConfigError, DiscoveryError, UnknownAgentError
from nemogym_sdk.adapters.axolotl import (
    NemoGymPlugin,
    NemoGymSettings,
    impute_failed,
    nemo_gym_env_reward,
    nemo_gym_verify_reward,
)
from nemogym_sdk.adapters.axolotl.dataset import build_dataset, row_of
from nemogym_sdk.adapters.axolotl.plugin import check_reward_functions, discover
from tests.axolotl.fakes import head_server
from tests.fakes import agent_server, resources_server


def _rows_file(tmp_path: Path, agents: list[str | None]) -> Path:
    path = tmp_path / "rows.jsonl"
    rows = []
    for i, agent in enumerate(agents):
        row: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": "Play!"}]},
            "task": i,
        }
        if agent is not None:
            row["agent_ref"] = {"name": agent}
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _settings(path: Path, head: str, **keys: Any) -> NemoGymSettings:
    return NemoGymSettings.from_cfg(
        {"nemo_gym_datasets": [str(path)], "nemo_gym_head_url": head, **keys}
    )


def _rows(settings: NemoGymSettings) -> list[Any]:
    dataset = build_dataset(settings)
    return [row_of(dataset[i]) for i in range(len(dataset))]


# --- rewards are wired once ---------------------------------------------------------------


def other_reward(completions: list[Any], prompts: Any = None, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


@pytest.mark.parametrize(
    ("funcs", "ok"),
    [
        ([nemo_gym_env_reward], True),
        ([nemo_gym_env_reward, other_reward], True),
        ([other_reward], False),
        ([nemo_gym_env_reward, nemo_gym_env_reward], False),
        ([nemo_gym_verify_reward], False),
    ],
)
def test_exactly_one_environment_reward(funcs: list[Any], ok: bool, tmp_path: Path) -> None:
    """The trainer must hold the mode's NeMo Gym reward exactly once: listed twice (axolotl's
    README listed it while the plugin appended it again: W-RWD-1), missing, or the other
    mode's is a ConfigError saying which line to write."""
    settings = NemoGymSettings.from_cfg(
        {
            "nemo_gym_datasets": ["x.jsonl"],
            "nemo_gym_multi_turn": True,
            "nemo_gym_sampler_url": "http://127.0.0.1:1",
        }
    )
    if ok:
        check_reward_functions(funcs, settings)
    else:
        with pytest.raises(
            ConfigError, match=r"nemogym_sdk\.adapters\.axolotl\.nemo_gym_env_reward"
        ):
            check_reward_functions(funcs, settings)


def _trainer(dataset: Any, funcs: list[Any], tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        reward_funcs=funcs,
        reward_func_names=[getattr(f, "__name__", "f") for f in funcs],
        reward_weights=[1.0, 0.5],
        accelerator=SimpleNamespace(is_main_process=True, num_processes=1, process_index=0),
        args=SimpleNamespace(output_dir=str(tmp_path / "out"), dataloader_num_workers=0),
        train_dataset=dataset,
    )


def test_verify_mode_binds_the_listed_reward_and_adds_none(tmp_path: Path) -> None:
    """post_trainer_create leaves the trainer's reward functions and weights as they were,
    and the listed verify reward now scores through /seed_session + /verify."""
    path = _rows_file(tmp_path, ["agent"])
    with (
        resources_server(reward=0.75) as scorer,
        agent_server() as agent,
        head_server(
            {"agent": agent.url}, {"scorer": scorer.url}, agent_resources={"agent": "scorer"}
        ) as head,
    ):
        cfg = {"nemo_gym_datasets": [str(path)], "nemo_gym_head_url": head.url}
        settings = NemoGymSettings.from_cfg(cfg)
        dataset = build_dataset(settings)
        funcs = [nemo_gym_verify_reward, other_reward]
        trainer = _trainer(dataset, funcs, tmp_path)
        plugin = NemoGymPlugin()
        plugin.post_trainer_create(cfg, trainer)
        try:
            assert trainer.reward_funcs == funcs and trainer.reward_weights == [1.0, 0.5]
            record = dataset[0]
            scores = trainer.reward_funcs[0](
                [[{"role": "assistant", "content": "crane"}]] * 2,
                None,
                nemo_gym_row=[record["nemo_gym_row"]] * 2,
                nemo_gym_row_id=[record["nemo_gym_row_id"]] * 2,
            )
            assert scores == [0.75, 0.75]
            assert scorer.calls("/verify") == 2 and scorer.calls("/seed_session") == 2
            assert scorer.bodies[-1]["task"] == 0  # the row's own fields reached /verify
            startup = json.loads((tmp_path / "out" / "nemo_gym" / "startup.json").read_text())
            assert startup["mode"] == "verify" and startup["agents"] == {"agent": agent.url}
        finally:
            plugin.post_train_unload(cfg)
    assert not nemo_gym_verify_reward.bound


def test_unbound_verify_reward_raises_instead_of_scoring_zero() -> None:
    with pytest.raises(ConfigError, match="not bound"):
        nemo_gym_verify_reward(["x"], None, nemo_gym_row=["{}"], nemo_gym_row_id=["r:1"])


# --- failures are not reward 0 ------------------------------------------------------------


def test_failed_rollouts_get_their_groups_completed_mean() -> None:
    """A failed rollout's reward is the mean of its group's completed rollouts, so the group
    baseline is that mean and the failure's advantage is 0; axolotl 0.19's deferred scoring
    would count a None (NaN) as 0 inside the mean (W-DATA-6). A group where nothing
    completed is None throughout."""
    rewards = nemo_gym_env_reward(
        ["a"] * 6,
        env_reward=[1.0, 0.0, 0.0, 0.5, 0.0, 0.0],
        nemo_gym_ok=[True, False, True, True, False, False],
        nemo_gym_group=["g1", "g1", "g1", "g2", "g3", "g3"],
    )
    assert rewards == [1.0, 0.5, 0.0, 0.5, None, None]
    group = [r for r in rewards[:3] if r is not None]
    assert sum(group) / len(group) == pytest.approx(0.5)  # = mean of the completed (1.0, 0.0)
    weak = [1.0, 0.0, 0.0]  # the failure scored 0
    assert sum(weak) / 3 != pytest.approx(0.5)


def test_env_reward_without_the_producer_columns_is_an_error() -> None:
    """No env_reward column means the producer is not wired: an error, not zeros."""
    with pytest.raises(ValueError, match="env_reward"):
        nemo_gym_env_reward(["a", "b"])
    assert impute_failed([None], [False], ["g"]) == [None]


def test_verify_failures_are_none_or_imputed(tmp_path: Path) -> None:
    """A completion whose /verify fails is None for TRL's scoring (left out of the
    statistics) and its group's completed mean for axolotl's deferred scoring; never 0."""
    from nemogym_sdk import Verifier

    ok_row = json.dumps({"responses_create_params": {"input": "x"}})  # -> the default
    bad_row = json.dumps(
        {"responses_create_params": {"input": "x"}, "resources_server_ref": {"name": "gone"}}
    )
    with resources_server(reward=0.75) as scorer:
        for impute, expected in ((False, [0.75, None]), (True, [0.75, 0.75])):
            verifier = Verifier({"scorer": scorer.url, "gone": "http://127.0.0.1:9"})
            nemo_gym_verify_reward.bind(verifier, resources_server="scorer", impute=impute)
            try:
                scores = nemo_gym_verify_reward(
                    ["crane", "slide"],
                    None,
                    nemo_gym_row=[ok_row, bad_row],
                    nemo_gym_row_id=["r:1", "r:1"],
                )
            finally:
                nemo_gym_verify_reward.unbind()
            assert scores == expected


# --- discovery: unknown agents, served name -----------------------------------------------


def test_unknown_agent_is_an_error_at_start(tmp_path: Path) -> None:
    """A row naming an agent that is not deployed fails at start, naming the row and the
    deployed agents; axolotl sent it to the first agent instead (W-DATA-13)."""
    path = _rows_file(tmp_path, ["known", "typo_agent"])
    with agent_server() as known, head_server({"known": known.url}) as head:
        settings = _settings(
            path,
            head.url,
            nemo_gym_multi_turn=True,
            nemo_gym_sampler_url="http://127.0.0.1:8000/v1",
        )
        with pytest.raises(
            UnknownAgentError, match=r"rows.jsonl:2 names agent 'typo_agent'.*known"
        ):
            discover(settings, _rows(settings))
        assert known.bodies == []


def test_row_without_agent_and_several_agents_is_an_error(tmp_path: Path) -> None:
    path = _rows_file(tmp_path, [None])
    with agent_server() as a, agent_server() as b, head_server({"a": a.url, "b": b.url}) as head:
        settings = _settings(
            path,
            head.url,
            nemo_gym_multi_turn=True,
            nemo_gym_sampler_url="http://127.0.0.1:8000/v1",
        )
        with pytest.raises(UnknownAgentError, match="nemo_gym_default_agent"):
            discover(settings, _rows(settings))
        settings = _settings(
            path,
            head.url,
            nemo_gym_multi_turn=True,
            nemo_gym_sampler_url="http://127.0.0.1:8000/v1",
            nemo_gym_default_agent="b",
        )
        assert discover(settings, _rows(settings)).default_agent == "b"


def test_served_name_must_be_the_adapter_name(tmp_path: Path) -> None:
    """NeMo Gym's model server requesting another model name than the adapter's is an
    error at start: every rollout would sample the base model (W-SYNC-1)."""
    path = _rows_file(tmp_path, ["agent"])
    sampler = "http://127.0.0.1:8000/v1"
    with agent_server() as agent:
        with head_server(
            {"agent": agent.url}, model_name="Qwen/Qwen3-8B", sampler_url=sampler
        ) as head:
            settings = _settings(
                path, head.url, nemo_gym_multi_turn=True, nemo_gym_sampler_url=sampler
            )
            with pytest.raises(ConfigError, match=r"requests model 'Qwen/Qwen3-8B'.*'policy'"):
                discover(settings, _rows(settings))
        with head_server({"agent": agent.url}, model_name="policy", sampler_url=sampler) as head:
            settings = _settings(
                path, head.url, nemo_gym_multi_turn=True, nemo_gym_sampler_url=sampler
            )
            assert discover(settings, _rows(settings)).agents == {"agent": agent.url}


def test_single_turn_row_without_a_resources_server_is_an_error(tmp_path: Path) -> None:
    path = _rows_file(tmp_path, ["agent"])
    with (
        agent_server() as agent,
        resources_server() as one,
        resources_server() as two,
        head_server({"agent": agent.url}, {"one": one.url, "two": two.url}) as head,
    ):
        settings = _settings(path, head.url)
        with pytest.raises(DiscoveryError, match="nemo_gym_resources_server"):
            discover(settings, _rows(settings))
        settings = _settings(path, head.url, nemo_gym_resources_server="two")
        assert set(discover(settings, _rows(settings)).resources_servers) == {"one", "two"}
