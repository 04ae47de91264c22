"""Beyond one machine, on loopback: two learner "nodes", sampler replicas behind a real
``vllm-router``, two NeMo Gym deployments (one started by NeMo Gym's own launcher), a few
GRPO steps through all of it, and the faults of a real cluster in the middle.

The cluster, started once for this module:

- sampler: two CPU-server replicas behind ``vllm-router``, ``nemogym_sdk.serve`` in front
  (``start_samplers``); every replica records what it generated;
- environments: ``target_chars`` twice, deployment A by ``GymStack`` (with its head server),
  deployment B by ``gym env start`` (``GymLauncher``: Ray and NeMo Gym's own head server);
- learner: ``torchrun --nnodes=2 --nproc_per_node=1`` on 127.0.0.1, one process per "node",
  the policy sharded across them (``--fsdp``, gloo), attached to the sampler's proxy and to
  both deployments through their head servers.

While it trains 6 steps (4 groups of 4), replica 1 is frozen (SIGSTOP) after step 1 and
thawed after step 2, then killed after step 3, and deployment A is stopped after step 4.
Each test below checks one thing the run must show. The fleet keeps 3 adapter versions
side by side, so that a second, asynchronous run (3 steps, ``--max-staleness 1``, through
deployment B and the replicas left) goes through the same cluster. (That a sharded step's
gradient equals one process's is ``tests/adapters/test_torch_fsdp.py``, and an asynchronous
one's ``tests/gym/test_train.py``; the adapters a replica refuses are the last two tests
here, which audit one more run, on replicas of its own.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.require import absent

pytestmark = [pytest.mark.gym, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
FREEZE_REPLICA_AFTER = 1  # steps logged
THAW_REPLICA_AFTER = 2
KILL_REPLICA_AFTER = 3
STOP_DEPLOYMENT_AFTER = 4
REPLICA_TIMEOUT_S = 15.0  # the proxy's --replica-timeout (its default)
MISMATCH_MAX = 1e-4  # fp32 learner and sampler: ~1e-5; a stale adapter: ~1e-1
GENERATIONS = 4
ROLLOUTS = 4 * GENERATIONS  # rows_per_step x num_generations, over both ranks
TYPED = {"agent_error", "transport_error", "timeout", "empty", "no_token_ids", "drift"}
K = 1
ASYNC_FLAGS = ("--mode", "async", "--max-staleness", str(K), "--steps", "3")
ADAPTER_VERSIONS = 3
"""Kept side by side by the fleet: what the asynchronous run's bound needs (K + 2); the
synchronous run uses the newest."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metrics(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trainer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def slots(url: str) -> dict[str, str]:
    cards = requests.get(f"{url}/models", timeout=10).json()["data"]
    return {c["id"]: c["root"] for c in cards if c.get("parent")}


def newest(url: str) -> str:
    """The directory of the newest ``policy`` version a fleet replica holds (its slots are
    ``policy@v<N>``: the fleet keeps several)."""
    held = {int(slot.rsplit("@v", 1)[1]): root for slot, root in slots(url).items()}
    return held[max(held)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from nemogym_sdk.gym import (
        GymLauncher,
        GymStack,
        GymVenvNotFoundError,
        PolicyModel,
        RouterNotFoundError,
        find_gym_venv,
        find_router,
        start_samplers,
    )
    from nemogym_sdk.serve.tiny import save_tiny

    try:
        find_gym_venv()
        find_router()
    except (GymVenvNotFoundError, RouterNotFoundError) as exc:
        absent(f"{exc}; loopback cluster skipped")
    root = tmp_path_factory.mktemp("cluster")
    model_dir = save_tiny(root / "model", 0)
    record = str(root / "record-{replica}.jsonl")
    with start_samplers(
        2,
        model_dir,
        log_dir=root / "samplers",
        replica_args=["--record", record],
        adapter_versions=ADAPTER_VERSIONS,
    ) as fleet:
        policy = PolicyModel(base_url=fleet.base_url, model="policy")
        with (
            GymStack(["target_chars"], policy, head_server=True, workdir=root / "a") as a,
            GymLauncher(["target_chars"], policy, workdir=root / "b") as b,
        ):
            assert a.directory.head_url is not None
            yield {"root": root, "fleet": fleet, "a": a, "b": b, "model_dir": model_dir}


def start_nodes(cluster: dict[str, Any], out: Path, heads: str, *flags: str) -> list[Any]:
    """``nemogym-train`` on two learner nodes (``torchrun --nnodes=2``), attached to the
    fleet's proxy and to the deployments at ``heads``; logs in ``<root>/<out.name>-node<r>``."""
    train_file = cluster["a"].config.environment("target_chars").train_path
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
    ]  # fmt: skip
    common = [
        "-m", "nemogym_sdk.train", "--backend-url", cluster["fleet"].base_url,
        "--group-affinity", "--head-url", heads, "--train-file", str(train_file),
        "--rows-per-step", "4", "--num-generations", str(GENERATIONS), "--fsdp",
        "--out", str(out), "--checkpoint-every", "100", "--episode-timeout", "60",
    ]  # fmt: skip
    nodes = []
    for rank in (0, 1):
        with (cluster["root"] / f"{out.name}-node{rank}.log").open("w") as log:
            nodes.append(
                subprocess.Popen(
                    [*argv, f"--node_rank={rank}", *common, *flags],
                    cwd=REPO,
                    env=trainer_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return nodes


def node_logs(cluster: dict[str, Any], out: Path) -> str:
    return "".join(
        f"--- node {r}\n{(cluster['root'] / f'{out.name}-node{r}.log').read_text()[-3000:]}"
        for r in (0, 1)
    )


@pytest.fixture(scope="module")
def run(cluster: dict[str, Any]) -> dict[str, Any]:
    """The 6-step run on two learner nodes (``torchrun``, `start_nodes`), with the faults
    injected while it trains."""
    fleet, a, b = cluster["fleet"], cluster["a"], cluster["b"]
    out = cluster["root"] / "run"
    heads = f"{a.directory.head_url},{b.head_url}"
    nodes = start_nodes(cluster, out, heads, "--steps", str(STEPS))
    events: dict[str, float] = {}

    def inject() -> None:
        while all(node.poll() is None for node in nodes):
            done = len(metrics(out))
            if done >= FREEZE_REPLICA_AFTER and "freeze" not in events:
                os.kill(fleet.replicas[1].pid, signal.SIGSTOP)
                events["freeze"] = done
            if done >= THAW_REPLICA_AFTER and "thaw" not in events:
                os.kill(fleet.replicas[1].pid, signal.SIGCONT)
                events["thaw"] = done
            if done >= KILL_REPLICA_AFTER and "replica" not in events:
                fleet.kill(1)
                events["replica"] = done
            if done >= STOP_DEPLOYMENT_AFTER and "deployment" not in events:
                a.stop()
                events["deployment"] = done
            time.sleep(0.05)

    injector = threading.Thread(target=inject, daemon=True)
    began = time.monotonic()
    injector.start()
    codes = [node.wait(timeout=900) for node in nodes]
    injector.join(10)
    print(f"cluster run: {time.monotonic() - began:.0f} s, faults after steps {events}")
    assert codes == [0, 0], node_logs(cluster, out)
    return {"steps": metrics(out), "events": events}


@pytest.fixture(scope="module")
def async_run(cluster: dict[str, Any]) -> dict[str, Any]:
    """Three asynchronous steps (``--mode async --max-staleness 1``) on two learner nodes
    (``torchrun``, `start_nodes`), through deployment B (NeMo Gym's launcher) and whichever
    replicas are left."""
    out = cluster["root"] / "async"
    began = time.monotonic()
    nodes = start_nodes(cluster, out, cluster["b"].head_url, *ASYNC_FLAGS)
    codes = [node.wait(timeout=600) for node in nodes]
    print(f"async cluster run: {time.monotonic() - began:.0f} s")
    assert codes == [0, 0], node_logs(cluster, out)
    return {"steps": metrics(out), "summary": json.loads((out / "summary.json").read_text())}


def test_two_learner_nodes_train_through_replicas_and_two_deployments(
    run: dict[str, Any],
) -> None:
    """Every step ran on both nodes (the sharded policy's metrics cover both ranks' groups),
    published the next adapter version, and learned from rollouts of both deployments'
    agents through the router's replicas."""
    steps = run["steps"]
    print([(s["step"], s["ok"], s["failures"], s["mismatch_max"]) for s in steps])
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert [s["adapter_version"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["grad_norm"] > 0 for s in steps)
    assert run["events"] == {
        "freeze": FREEZE_REPLICA_AFTER,
        "thaw": THAW_REPLICA_AFTER,
        "replica": KILL_REPLICA_AFTER,
        "deployment": STOP_DEPLOYMENT_AFTER,
    }


def test_every_step_sampled_the_version_the_learner_had(run: dict[str, Any]) -> None:
    """The sampler's logprobs equal the learner's at fp32 levels on every step, whichever
    replica played a group: every replica served each new version (a replica left on the
    previous adapter would show a mismatch of ~0.1)."""
    for step in run["steps"]:
        if step["ok"]:
            assert step["mismatch_max"] < MISMATCH_MAX, step


def test_nothing_is_lost_or_counted_twice_and_failures_are_typed(run: dict[str, Any]) -> None:
    """Each step trained exactly its 4 groups x 4 rollouts, whatever failed; a failure is
    one of the typed statuses, never a silent reward 0."""
    for step in run["steps"]:
        assert step["rollouts"] == ROLLOUTS and step["groups"] == 4, step
        assert set(step["failures"]) <= TYPED, step
        assert step["ok"] + sum(step["failures"].values()) == ROLLOUTS


def test_a_killed_replica_leaves_the_router_and_the_run_goes_on(
    cluster: dict[str, Any], run: dict[str, Any]
) -> None:
    """Replica 1 died after step 3: the router stopped sending to it (the proxy removed it at
    the next publish), the survivor serves the last version, and the steps after it are whole
    again."""
    fleet = cluster["fleet"]
    survivor, dead = fleet.replicas[0].base_url, fleet.replicas[1].base_url
    routed = fleet.router.healthy()
    assert dead.removesuffix("/v1") not in routed and survivor.removesuffix("/v1") in routed
    assert newest(survivor).endswith(f"v{STEPS:06d}")
    after = run["steps"][KILL_REPLICA_AFTER + 1 :]
    lost = [(s["step"], s["failures"]) for s in after]
    assert all(s["ok"] >= ROLLOUTS - GENERATIONS for s in after), lost  # a group at most
    assert run["steps"][-1]["ok"] == ROLLOUTS


def test_a_frozen_replica_holds_no_step_and_comes_back_caught_up(
    cluster: dict[str, Any], run: dict[str, Any]
) -> None:
    """Replica 1 frozen after step 1 (alive, silent) and thawed after step 2: the proxy's
    health watch took it out of the router within its deadline and sent again what it held,
    so no step waited for the 600 s generation timeout, and none lost a rollout to it; it
    came back into the router only after loading every version served (no token of a
    version it missed: ``test_every_step_sampled_the_version_the_learner_had``)."""
    frozen = run["steps"][FREEZE_REPLICA_AFTER : THAW_REPLICA_AFTER + 1]
    print([(s["step"], s["rollout_s"], s["failures"]) for s in frozen])
    assert all(s["rollout_s"] < REPLICA_TIMEOUT_S + 30 for s in frozen), frozen
    assert all(s["ok"] == ROLLOUTS for s in frozen), frozen
    log = cluster["fleet"].proxy.process.tail(2000)
    assert re.search(r"is unreachable \(.*\): removed from the router", log), log[-3000:]
    assert "is back in the router, every version loaded" in log, log[-3000:]


def test_a_deployment_that_disappears_costs_typed_failures_and_the_other_goes_on(
    cluster: dict[str, Any], run: dict[str, Any]
) -> None:
    """Deployment A stopped after step 4: its rollouts fail over to deployment B (NeMo Gym's
    own launcher), which plays every later step whole."""
    late = run["steps"][STOP_DEPLOYMENT_AFTER + 1 :]
    assert late and all(s["ok"] == ROLLOUTS for s in late), [
        (s["step"], s["failures"]) for s in late
    ]
    assert not cluster["a"].is_running
    assert requests.get(f"{cluster['b'].head_url}/readyz", timeout=5).status_code == 200


def test_an_asynchronous_run_on_two_nodes_keeps_its_staleness_bound(
    async_run: dict[str, Any],
) -> None:
    """``--mode async`` on two nodes (rank 0 owns the engine, each rank trains its share of
    every step's groups): each step trains 4 whole groups, publishes the next version, and
    every policy token says which version sampled it, none more than K behind."""
    steps = async_run["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert [s["adapter_version"] for s in steps] == [1, 2, 3]
    for step in steps:
        assert step["rollouts"] == ROLLOUTS and step["groups"] == 4, step
        assert step["unversioned_tokens"] == 0 and step["staleness_max"] <= K, step
        assert sum(step["staleness"].values()) == step["policy_tokens"] > 0, step
        assert step["grad_norm"] > 0, step
    assert steps[0]["staleness"] == {"0": steps[0]["policy_tokens"]}
    assert async_run["summary"]["mode"] == "async"


REFUSALS = {"v000003": 1, "v000004": 2}
"""The second replica refuses version 3 once (``--sync-retries 1`` publishes it again) and
version 4 twice (the retry is refused too: the run stops)."""


@pytest.fixture(scope="module")
def refusing_run(
    cluster: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """nemogym-train attached to two replicas behind a router, the second refusing adapter
    loads as ``REFUSALS`` says: the process, its metrics, what each replica serves after, the
    refusals counted and the router's log."""
    from nemogym_sdk.gym import start_router, start_serve
    from tests.fakes import serve
    from tests.replicas import RefusingReplica

    tmp_path = tmp_path_factory.mktemp("refusing")
    model_dir = cluster["model_dir"]
    with (
        start_serve(model=str(model_dir), seed=0, log_path=tmp_path / "r0.log", fork=True) as first,
        start_serve(
            model=str(model_dir), seed=1, log_path=tmp_path / "r1.log", fork=True
        ) as second,
    ):
        refusing = RefusingReplica(second.base_url)
        refusing.refusals = dict(REFUSALS)
        with serve(refusing.routes) as wrapped:
            replicas = [first.base_url, f"{wrapped.url}/v1"]
            with start_router(replicas, log_path=tmp_path / "router.log") as router:
                argv = [sys.executable, "-m", "nemogym_sdk.train", "--steps", "5"]
                argv += ["--rows-per-step", "2", "--num-generations", str(GENERATIONS)]
                argv += ["--out", str(tmp_path / "run")]
                argv += ["--router-url", router.base_url, "--replica-urls", ",".join(replicas)]
                argv += ["--sync-retries", "1"]
                done = subprocess.run(
                    argv, cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=600
                )
                served = [str(slots(url).get("policy")) for url in replicas]
    return {
        "done": done,
        "steps": metrics(tmp_path / "run"),
        "served": served,
        "refused": refusing.refused,
        "router_log": (tmp_path / "router.log").read_text(),
    }


def test_a_refused_adapter_is_published_again_when_retries_are_configured(
    refusing_run: dict[str, Any],
) -> None:
    """With ``--sync-retries 1`` version 3's one refusal costs one retry: steps 0 to 2 run
    and publish versions 1 to 3. After each step the router forgets the step's groups: its
    table never holds more than the step's two."""
    steps = refusing_run["steps"]
    assert [s["adapter_version"] for s in steps] == [1, 2, 3], refusing_run["done"].stderr[-3000:]
    log = refusing_run["router_log"]
    trained = [row for s in steps for _, row in s["trained_groups"]]
    assert re.findall(r"SLL: finished session '([^']+)'", log)[: len(trained)] == trained
    held = re.findall(r"SLL: new session .* \(active sessions on replica: (\d+)\)", log)
    assert len(held) >= len(trained) and max(map(int, held)) <= 2, held


def test_a_refused_adapter_stops_the_run_on_the_last_good_version(
    refusing_run: dict[str, Any],
) -> None:
    """Version 4 is refused again when tried again: the run stops after step 2 with a
    one-line error naming that replica, and both replicas still serve version 3."""
    done = refusing_run["done"]
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("nemogym-train: LoraSyncError:") and "refused it" in last, last
    assert "test fault" in last and "Every replica keeps what it served before" in last
    assert [s["step"] for s in refusing_run["steps"]] == [0, 1, 2]  # step 3's publish refused
    assert all(path.endswith("v000003") for path in refusing_run["served"]), refusing_run
    assert refusing_run["refused"] == sum(REFUSALS.values())
