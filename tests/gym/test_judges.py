"""Judges and other model servers an environment calls, wired by ``GymStack(judge=...)``.

Config tests (no processes) cover each shape NeMo Gym 0.7.0's configs use: a judge that is
``policy_model``, a judge the config names but does not define (``simpleqa``'s
``genrm_model``), a judge it defines as an ``openai_model`` on ``${judge_base_url}``, a
``{_copy: policy_model}`` simulator, and the servers the stack refuses.

Real-server tests play three judge-scored environments, one of each shape
(``equivalence_llm_judge``, ``simpleqa``, ``over_refusal_detection``), through
``AgentClient`` and ``Verifier``, with scripted ``nemogym_sdk.serve`` judges whose fixed
answer is a verdict all three parse alike: ``YES`` is correct / equal / complied, ``NO``
incorrect / different / refused. The reward follows the verdict, and each judge's
``--record`` file shows it answered every verdict.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest

from nemogym_sdk import AgentClient, RawRun, RolloutStatus, Timeouts, Verifier, VerifyItem
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    BackendProcess,
    GymStack,
    PolicyModel,
    ServerNotReadyError,
    build_stack_config,
    free_loopback_ports,
    start_serve,
)
from nemogym_sdk.gym.judges import JUDGE_INSTANCE

from .fakes import TOY_CONFIG, counting_ports, make_venv
from .stacks import StackFactory

MODEL = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")
JUDGE = PolicyModel(base_url="http://127.0.0.1:9000/v1", model="judge-9", api_key="jk")
MODELS = "responses_api_models"

ENVIRONMENTS = ["equivalence_llm_judge", "simpleqa", "over_refusal_detection"]
ROWS_PER_ENVIRONMENT = 2
# simpleqa grades by the first letter (A correct, B incorrect); equivalence_llm_judge
# looks for [[A=B]] / [[A!=B]]; over_refusal_detection for the last [[COMPLIED]] / [[REFUSED]].
YES = "A [[A=B]] [[COMPLIED]]"
NO = "B [[A!=B]] [[REFUSED]]"


def _env(judge_ref: str, **server: Any) -> dict[str, Any]:
    """The toy environment with a resources server that calls ``judge_ref``."""
    config = copy.deepcopy(TOY_CONFIG)
    block = config["toy"]["resources_servers"]["toy"]
    block["judge_model_server"] = {"type": MODELS, "name": judge_ref}
    block.update(server)
    return config


def _openai_judge(name: str = "judge_model") -> dict[str, Any]:
    return {
        name: {
            MODELS: {
                "openai_model": {
                    "entrypoint": "app.py",
                    "openai_base_url": "${judge_base_url}",
                    "openai_api_key": "${judge_api_key}",
                    "openai_model": "${judge_model_name}",
                }
            }
        }
    }


def _build(tmp_path: Path, configs: dict[str, dict[str, Any]], **kwargs: Any) -> Any:
    venv = make_venv(tmp_path / "venv", configs)
    return build_stack_config(venv, list(configs), MODEL, allocate_ports=counting_ports(), **kwargs)


def _vllm(config: Any, instance: str) -> dict[str, Any]:
    block = config.global_config[instance][MODELS]["vllm_model"]
    assert isinstance(block, dict)
    return block


def _judge_ref(config: Any, server: str = "toy") -> Any:
    return config.global_config[server]["resources_servers"][server]["judge_model_server"]


# --------------------------------------------------------------------------- config shapes


def test_policy_judge_stays_on_the_policy_unless_a_judge_is_given(tmp_path: Path) -> None:
    """``judge_model_server: policy_model`` keeps the policy's server by default; an
    explicit judge gets a ``judge_model`` server on its endpoint, token ids off."""
    by_default = _build(tmp_path / "a", {"toy": _env("policy_model")})
    assert _judge_ref(by_default)["name"] == "policy_model"
    assert [s.instance for s in by_default.servers] == ["policy_model", "toy", "toy_simple_agent"]

    wired = _build(tmp_path / "b", {"toy": _env("policy_model")}, judge=JUDGE)
    assert _judge_ref(wired) == {"type": MODELS, "name": JUDGE_INSTANCE}
    block = _vllm(wired, JUDGE_INSTANCE)
    assert (block["base_url"], block["model"], block["api_key"]) == (
        "http://127.0.0.1:9000/v1",
        "judge-9",
        "jk",
    )
    assert block["return_token_id_information"] is False
    assert wired.server(JUDGE_INSTANCE).server_type == MODELS
    agent = wired.global_config["toy_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["model_server"]["name"] == "policy_model", "the agent still samples the policy"
    assert _vllm(wired, "policy_model")["return_token_id_information"] is True


def test_undeclared_judge_name_gets_a_server_on_the_policy_backend_by_default(
    tmp_path: Path,
) -> None:
    """A judge the config names but does not define (``genrm_model``) is added; without
    ``judge`` it asks the policy's backend for the policy's served model."""
    config = _build(tmp_path, {"toy": _env("genrm_model")})
    block = _vllm(config, "genrm_model")
    assert (block["base_url"], block["model"]) == (MODEL.base_url, MODEL.model)
    assert block["return_token_id_information"] is False
    assert config.global_config["judge_base_url"] == MODEL.base_url


def test_declared_openai_judge_is_replaced_and_shared(tmp_path: Path) -> None:
    """Two environments declaring ``judge_model: openai_model`` on ``${judge_base_url}``
    share one ``vllm_model`` on the judge endpoint; their top-level variables are kept."""
    first = {**_env("judge_model"), **_openai_judge(), "judge_base_url": None}
    second = yaml_renamed(first, "twin")
    config = _build(tmp_path, {"toy": first, "twin": second}, judge=JUDGE)
    judges = [s for s in config.servers if s.instance == "judge_model"]
    assert len(judges) == 1 and judges[0].impl == "vllm_model"
    assert _vllm(config, "judge_model")["model"] == "judge-9"
    assert config.global_config["judge_base_url"] == JUDGE.base_url
    assert config.global_config["judge_model_name"] == "judge-9"
    assert _judge_ref(config, "twin")["name"] == "judge_model"


def test_copy_of_the_policy_is_a_model_dependency(tmp_path: Path) -> None:
    """``simulator_model: {_copy: policy_model}`` becomes a server on the judge endpoint."""
    env = {**_env("simulator_model"), "simulator_model": {"_copy": "policy_model"}}
    config = _build(tmp_path, {"toy": env}, judge=JUDGE)
    assert _vllm(config, "simulator_model")["base_url"] == JUDGE.base_url


def test_references_anywhere_in_a_resources_server_are_wired(tmp_path: Path) -> None:
    """User simulators and panels in nested blocks and lists are model dependencies too."""
    env = _env(
        "judge_model",
        panel=[{"type": MODELS, "name": "panel_a"}],
        simulation={"user_model_server": {"type": MODELS, "name": "user_sim"}},
    )
    config = _build(tmp_path, {"toy": env})
    models = {s.instance for s in config.servers if s.server_type == MODELS}
    assert models == {"judge_model", "panel_a", "user_sim", "policy_model"}


def test_unwirable_model_servers_are_refused_naming_the_key(tmp_path: Path) -> None:
    """A model server that is more than an OpenAI-compatible forwarder is refused by name."""
    genrm = {"genrm_model": {MODELS: {"genrm_model": {"entrypoint": "app.py"}}}}
    with pytest.raises(ConfigError, match="'genrm_model' is a genrm_model server"):
        _build(tmp_path / "a", {"toy": {**_env("genrm_model"), **genrm}})
    sampled = copy.deepcopy(_env("judge_model"))
    agent = sampled["toy_simple_agent"]["responses_api_agents"]["simple_agent"]
    agent["model_server"]["name"] = "judge_model"
    with pytest.raises(ConfigError, match="agent 'toy_simple_agent' samples from 'judge_model'"):
        _build(tmp_path / "b", {"toy": {**sampled, **_openai_judge()}})
    clash = {**_env("policy_model"), "flag": 1}
    other = {**yaml_renamed(_env("policy_model"), "twin"), "flag": 2}
    with pytest.raises(ConfigError, match="top-level key 'flag' is 1 in 'toy' but 2 in 'twin'"):
        _build(tmp_path / "c", {"toy": clash, "twin": other})


def test_dead_judge_endpoint_fails_before_any_server_starts(tmp_path: Path) -> None:
    """``backend_timeout`` waits for the judge endpoint too, after the policy's backend."""

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *args: Any) -> None:
            pass

    venv = make_venv(tmp_path / "venv", {"toy": _env("judge_model")})
    (dead,) = free_loopback_ports(1)
    with ThreadingHTTPServer(("127.0.0.1", 0), Models) as backend:
        threading.Thread(target=backend.serve_forever, daemon=True).start()
        model = PolicyModel(base_url=f"http://127.0.0.1:{backend.server_port}/v1", model="m")
        judge = PolicyModel(base_url=f"http://127.0.0.1:{dead}/v1", model="j")
        stack = GymStack(
            ["toy"], model, judge=judge, venv=venv, workdir=tmp_path / "w", backend_timeout=0.3
        )
        try:
            with pytest.raises(ServerNotReadyError, match="judge endpoint") as caught:
                stack.start()
        finally:
            backend.shutdown()
    assert f"127.0.0.1:{dead}/v1/models" in caught.value.log_tail
    assert stack.pids == {}


def yaml_renamed(config: dict[str, Any], name: str) -> dict[str, Any]:
    """``config`` with its ``toy`` servers renamed (the judge instances keep their names)."""
    renamed: dict[str, Any] = {}
    for key, value in copy.deepcopy(config).items():
        if key.startswith("toy"):
            key = name + key[3:]
        renamed[key] = value
    renamed[name]["resources_servers"] = {name: renamed[name]["resources_servers"].pop("toy")}
    agent = renamed[f"{name}_simple_agent"]["responses_api_agents"]["simple_agent"]
    agent["resources_server"]["name"] = name
    agent["datasets"][0]["jsonl_fpath"] = f"resources_servers/{name}/data/example.jsonl"
    return renamed


# --------------------------------------------------------------------------- real servers


def _scripted(tmp: pytest.TempPathFactory, name: str, answer: str) -> BackendProcess:
    directory = tmp.mktemp(name)
    return start_serve(
        mode="scripted",
        logprobs_mode="raw_logprobs",
        served_model_name=name,
        extra_args=["--scripted-answer", answer, "--record", str(directory / "record.jsonl")],
        log_path=directory / "serve.log",
        fork=True,
    )


def _records(backend: BackendProcess) -> list[str]:
    """Lines of the backend's ``--record`` file: one per generation it answered."""
    path = backend.log_path.parent / "record.jsonl"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(scope="module")
def judge_yes(gym_venv: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """A scripted server whose every answer is the ``YES`` verdict."""
    with _scripted(tmp_path_factory, "judge-yes", YES) as served:
        yield served


@pytest.fixture(scope="module")
def judge_no(gym_venv: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """A scripted server whose every answer is the ``NO`` verdict."""
    with _scripted(tmp_path_factory, "judge-no", NO) as served:
        yield served


def _rows(stack: GymStack) -> list[dict[str, Any]]:
    rows = []
    for environment in ENVIRONMENTS:
        for row in stack.example_rows(environment)[:ROWS_PER_ENVIRONMENT]:
            row = dict(row)
            row["agent_ref"] = {
                "type": "responses_api_agents",
                "name": stack.environment(environment).agent,
            }
            rows.append(row)
    return rows


def _play(stack: GymStack) -> list[RawRun]:
    with AgentClient(stack.directory, timeouts=Timeouts(request=600.0, total=1200.0)) as client:
        raws = client.run_raw_sync(_rows(stack))
    for raw in raws:
        assert raw.status is RolloutStatus.OK, raw.error
    return raws


def _environment(raw: RawRun) -> str:
    """The environment a rollout was played in (its agent is ``<environment>_simple_agent``)."""
    return str(raw.request.row.data["agent_ref"]["name"]).removesuffix("_simple_agent")


def _check_verdicts(raws: list[RawRun], reward: float, verdict: str) -> None:
    """Every rollout was judged, without a judge failure, and scored as ``verdict`` says."""
    assert sorted({_environment(raw) for raw in raws}) == sorted(ENVIRONMENTS)
    for raw in raws:
        body = raw.json()
        environment = _environment(raw)
        assert body["failure_kind"] is None, body.get("failure_reason")
        assert body["reward"] == reward, (environment, body)
        if environment == "equivalence_llm_judge":
            (evaluation,) = body["judge_evaluations"]
            assert evaluation["verdict_label"] == ("[[A=B]]" if verdict == YES else "[[A!=B]]")
        elif environment == "simpleqa":
            assert body["judge_output"] == verdict
            assert body["verdict"] == ("correct" if verdict == YES else "incorrect")
        else:
            evaluation = body["judge_evaluation"]
            assert evaluation["error"] is None
            expected = "[[COMPLIED]]" if verdict == YES else "[[REFUSED]]"
            assert evaluation["verdict_label"] == expected


@pytest.mark.gym
@pytest.mark.slow
def test_default_judge_is_the_policy_backend(
    stack_factory: StackFactory, judge_yes: BackendProcess
) -> None:
    """Without ``judge`` every judge asks the policy's backend: it answers YES, reward 1."""
    policy = judge_yes.policy_model()
    with stack_factory(ENVIRONMENTS, model=policy) as stack:
        assert set(stack.directory.models) == {"policy_model", "genrm_model", "judge_model"}
        before = len(_records(judge_yes))
        raws = _play(stack)
    _check_verdicts(raws, 1.0, YES)
    # One policy turn and one verdict per rollout, all from the policy's backend.
    assert len(_records(judge_yes)) - before == 2 * len(raws)


@pytest.mark.gym
@pytest.mark.slow
def test_explicit_judge_scores_every_environment(
    stack_factory: StackFactory, judge_yes: BackendProcess, judge_no: BackendProcess
) -> None:
    """With ``judge`` the verdicts come from it, even where the config's judge is the
    policy (``equivalence_llm_judge``): the policy answers YES, the judge says NO, reward 0.
    ``Verifier`` scores the same completions through the same judge."""
    policy = judge_yes.policy_model()
    judge = attrs.evolve(judge_no.policy_model(), api_key="judge-key")
    with stack_factory(ENVIRONMENTS, model=policy, judge=judge) as stack:
        judge_config = stack.config.global_config["judge_model"][MODELS]["vllm_model"]
        assert (judge_config["base_url"], judge_config["model"]) == (judge_no.base_url, "judge-no")
        yes_before, no_before = len(_records(judge_yes)), len(_records(judge_no))
        raws = _play(stack)
        assert len(_records(judge_yes)) - yes_before == len(raws), "policy turns only"
        assert len(_records(judge_no)) - no_before == len(raws), "one verdict per rollout"
        items = [
            VerifyItem(
                resources_server=_environment(raw),
                row=raw.request.row.data,
                completion=YES,
            )
            for raw in raws
        ]
        with Verifier(stack.directory, timeouts=Timeouts(request=300.0)) as verifier:
            results = verifier.verify_sync(items)
    _check_verdicts(raws, 0.0, NO)
    for item, result in zip(items, results, strict=True):
        assert result.status is RolloutStatus.OK, result.error
        assert result.reward == 0.0, (item.resources_server, result.response)
    assert len(_records(judge_no)) - no_before == 2 * len(raws)
