"""Sampler replicas behind a real ``vllm-router``, with ``nemogym_sdk.serve`` in front: adapter
publication reaches every replica (all or nothing), a group's requests stay on one replica,
and a replica that refuses an adapter or dies is handled (CPU server replicas, real HTTP)."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from nemogym_sdk import LoraSyncError
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.serve.backend import DEFAULT_MAX_BATCH
from nemogym_sdk.wire import CARD_VERSIONS_FIELD
from tests.fakes import serve
from tests.lora_models import perturb, tiny_lora
from tests.replicas import RefusingReplica
from tests.require import absent

pytest.importorskip("peft")
KEPT = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nemogym_sdk.gym import RouterNotFoundError, find_router
    from nemogym_sdk.serve.tiny import save_tiny

    try:
        find_router()
    except RouterNotFoundError as exc:
        absent(f"{exc}; replica tests skipped")
    return save_tiny(tmp_path_factory.mktemp("model") / "tiny", 0)


@pytest.fixture(scope="module")
def fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two CPU replicas behind the router, the proxy in front; each replica records what it
    generated (``records``)."""
    from nemogym_sdk.gym import start_samplers

    logs = tmp_path_factory.mktemp("fleet")
    record = str(logs / "record-{replica}.jsonl")
    with start_samplers(
        2, model_dir, adapter_versions=KEPT, log_dir=logs, replica_args=["--record", record]
    ) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def records(fleet: Any) -> list[Path]:
    logs = fleet.proxy.log_path.parent
    return [logs / f"record-{i}.jsonl" for i in range(2)]


def slots(url: str) -> dict[str, str]:
    """A replica's adapters: slot name -> the path it was loaded from."""
    cards = requests.get(f"{url}/models", timeout=10).json()["data"]
    return {c["id"]: c["root"] for c in cards if c.get("parent")}


def policy_card(url: str) -> dict[str, Any]:
    cards = requests.get(f"{url}/models", timeout=10).json()["data"]
    return next(c for c in cards if c["id"] == "policy")


def ask(url: str, key: str, content: str = "hi") -> requests.Response:
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        "logprobs": True,
        "session_params": {"session_id": key},  # what NeMo Gym merges in from the row
    }
    return requests.post(f"{url}/chat/completions", json=body, timeout=60)


@pytest.mark.gym
def test_every_replica_serves_each_published_version(fleet: Any, tmp_path: Path) -> None:
    """``LoraSync`` publishes to the proxy as to one sampler; every replica loads each version
    into its slot, the oldest beyond the kept three are unloaded everywhere, and the proxy's
    card says which versions all of them serve, and how many generations they decode at
    once together."""
    model = tiny_lora()
    sync = LoraSync(fleet.base_url, "policy", tmp_path, keep=KEPT)
    sync.initialize(model)
    for version in range(1, 5):
        perturb(model, seed=version)
        sync.sync(model)
        expected = {
            f"policy@v{v}": str(sync.version_path(v))
            for v in range(max(0, version - 2), version + 1)
        }
        for url in fleet.replica_urls:
            assert slots(url) == expected, url
        assert policy_card(fleet.base_url)[CARD_VERSIONS_FIELD] == sorted(
            int(s.split("@v")[1]) for s in expected
        )
    assert sync.served_version() == 4
    # what the engine may start at once: both replicas' batches (proxy's card)
    assert sync.decode_capacity() == len(fleet.replica_urls) * DEFAULT_MAX_BATCH


@pytest.mark.gym
def test_a_groups_requests_stay_on_one_replica_and_groups_spread(
    fleet: Any, records: list[Path]
) -> None:
    """The affinity key NeMo Gym forwards from the row reaches the router as ``x-session-id``:
    every request of a key lands on one replica, and the keys use both."""
    model = tiny_lora()
    sync = LoraSync(fleet.base_url, "policy", fleet.proxy.log_path.parent / "affinity")
    sync.initialize(model)
    before = [len(path.read_text().splitlines()) if path.exists() else 0 for path in records]
    keys = [f"row-{i}" for i in range(24)]
    for _ in range(3):
        for key in keys:
            # each key has a prompt of its own length (byte tokens): the records tell them apart
            response = ask(fleet.base_url, key, content="q" * (1 + keys.index(key)))
            assert response.status_code == 200, response.text
    where: dict[int, set[int]] = collections.defaultdict(set)
    for replica, path in enumerate(records):
        for line in path.read_text().splitlines()[before[replica] :]:
            record = json.loads(line)
            where[record["prompt_tokens"]].add(replica)
    assert len(where) == len(keys)  # one prompt per key
    assert all(len(replicas) == 1 for replicas in where.values()), where
    assert {r for replicas in where.values() for r in replicas} == {0, 1}


def _sessions(log: Path) -> tuple[dict[str, int], list[str]]:
    """The router's log: each new session's replica's count of active sessions then, and
    the finished sessions in order."""
    text = log.read_text()
    new = r"SLL: new session '([^']+)' -> .* \(active sessions on replica: (\d+)\)"
    started = {key: int(count) for key, count in re.findall(new, text)}
    return started, re.findall(r"SLL: finished session '([^']+)'", text)


@pytest.mark.gym
def test_finished_groups_leave_the_routers_table(fleet: Any) -> None:
    """``finish_sessions`` through the proxy reaches the router (``POST /finish_session``):
    it forgets each finished group's key, so a replica's count of active sessions covers
    the groups in flight, not every group so far; a server without a router answers the
    route with nothing to forget, and the key is required."""
    from nemogym_sdk.samplers import finish_sessions

    first = [f"finished-{i}" for i in range(8)]
    for key in first:
        assert ask(fleet.base_url, key).status_code == 200
    assert finish_sessions(fleet.base_url, [*first, first[0]]) == []
    assert ask(fleet.base_url, "later").status_code == 200
    counts, finished = _sessions(fleet.router.process.log_path)
    assert finished[-len(first) :] == first  # each key once, in order
    # eight groups held a replica's count 3 or more above where it started; once they are
    # finished, the next group finds the count where it was before them
    assert counts["later"] <= max(counts[k] for k in first) - 3, counts
    assert finish_sessions(fleet.replica_urls[0], ["no-router"]) == []  # a plain server
    proxy = fleet.base_url.removesuffix("/v1")
    refused = requests.post(f"{proxy}/finish_session", timeout=10)
    assert refused.status_code == 400 and "session_id" in refused.text


@pytest.fixture
def faulty(model_dir: Path, tmp_path: Path) -> Iterator[tuple[Any, Any, RefusingReplica]]:
    """Two CPU replicas, the second behind a ``RefusingReplica``; router; proxy."""
    from nemogym_sdk.gym import start_router, start_serve

    with (
        start_serve(model=str(model_dir), seed=0, log_path=tmp_path / "r0.log", fork=True) as first,
        start_serve(
            model=str(model_dir), seed=1, log_path=tmp_path / "r1.log", fork=True
        ) as second,
    ):
        refusing = RefusingReplica(second.base_url)
        with serve(refusing.routes) as wrapped:
            urls = [first.base_url, f"{wrapped.url}/v1"]
            with start_router(urls, log_path=tmp_path / "router.log") as router:
                args = ["--backend", "vllm", "--vllm-url", router.base_url, "--adapter-versions"]
                args += [str(KEPT), *[a for url in urls for a in ("--replica", url)]]
                with start_serve(
                    model=str(model_dir),
                    extra_args=args,
                    log_path=tmp_path / "proxy.log",
                    fork=True,
                ) as proxy:
                    yield proxy, router, refusing


@pytest.mark.gym
def test_a_refused_adapter_leaves_every_replica_on_the_last_good_version(
    faulty: tuple[Any, Any, RefusingReplica], tmp_path: Path
) -> None:
    """One replica refuses version 2: the publish fails naming it, the replica that had
    loaded version 2 unloads it again, both keep serving versions 0 and 1, and a later
    publish (the fault gone) reaches both."""
    proxy, router, refusing = faulty
    replicas = [f"{root}/v1" for root in router.worker_urls]
    model = tiny_lora()
    sync = LoraSync(proxy.base_url, "policy", tmp_path)
    sync.initialize(model)
    perturb(model, seed=1)
    sync.sync(model)
    good = {f"policy@v{v}": str(sync.version_path(v)) for v in (0, 1)}
    refusing.refuse = True
    perturb(model, seed=2)
    with pytest.raises(LoraSyncError, match=rf"replica {router.worker_urls[1]} refused.*fault"):
        sync.sync(model)
    assert sync.version == 1
    for url in replicas:
        assert slots(url) == good, url
    assert policy_card(proxy.base_url)[CARD_VERSIONS_FIELD] == [0, 1]
    assert ask(proxy.base_url, "after the refusal").status_code == 200
    refusing.refuse = False
    sync.sync(model)
    for url in replicas:
        assert set(slots(url)) == {"policy@v0", "policy@v1", "policy@v2"}, url


@pytest.mark.gym
def test_a_dead_replica_leaves_the_router_and_publication_goes_on(
    model_dir: Path, tmp_path: Path
) -> None:
    """A replica killed while requests play: every request still gets an answer (the router
    retries on the other one), the next publish drops the dead replica from the router
    instead of failing, and the survivor serves the new version."""
    from nemogym_sdk.gym import start_samplers

    with start_samplers(2, model_dir, adapter_versions=KEPT, log_dir=tmp_path) as fleet:
        model = tiny_lora()
        sync = LoraSync(fleet.base_url, "policy", tmp_path / "adapters")
        sync.initialize(model)
        statuses: list[int] = []

        def play() -> None:
            for i in range(30):
                statuses.append(ask(fleet.base_url, f"key-{i % 10}").status_code)

        players = [threading.Thread(target=play) for _ in range(4)]
        for player in players:
            player.start()
        fleet.kill(1)
        for player in players:
            player.join(120)
        assert len(statuses) == 120
        assert statuses.count(200) >= 110, collections.Counter(statuses)
        perturb(model, seed=1)
        assert sync.sync(model).version == 1
        survivor, dead = fleet.replicas[0].base_url, fleet.replicas[1].base_url
        assert slots(survivor) == {f"policy@v{v}": str(sync.version_path(v)) for v in (0, 1)}
        routed = fleet.router.healthy()
        assert dead.removesuffix("/v1") not in routed and survivor.removesuffix("/v1") in routed
        assert all(ask(fleet.base_url, f"key-{i}").status_code == 200 for i in range(10))


def test_a_frozen_replica_leaves_the_publish_and_comes_back_with_what_is_served(
    model_dir: Path, tmp_path: Path
) -> None:
    """A replica frozen (SIGSTOP: alive, silent) while it generates and while versions are
    published: the proxy's health watch drops it within its replica deadline (3 s here; the
    generation timeout is 600 s) and sends the generations it held to the other replica,
    so every one is answered while it is still frozen; each publish ends without it, and
    the router stops sending it requests. Thawed, it is let back only once
    it has loaded every version served then, in place, and unloaded the one evicted while
    it was out: its adapters equal the survivor's when the router routes to it again, and
    the next publish reaches both."""
    from nemogym_sdk.gym import start_samplers

    with start_samplers(
        2,
        model_dir,
        adapter_versions=2,
        log_dir=tmp_path,
        proxy_args=["--replica-timeout", "3"],
    ) as fleet:
        model = tiny_lora()
        sync = LoraSync(fleet.base_url, "policy", tmp_path / "adapters")
        sync.initialize(model)
        survivor, frozen = fleet.replicas
        answers: dict[str, requests.Response] = {}

        def generate(key: str) -> None:
            body = {"model": "policy", "messages": [{"role": "user", "content": key}]}
            body |= {"max_tokens": 200, "ignore_eos": True, "session_params": {"session_id": key}}
            url = f"{fleet.base_url}/chat/completions"
            answers[key] = requests.post(url, json=body, timeout=90)

        playing = [threading.Thread(target=generate, args=(f"held-{i}",)) for i in range(6)]
        for thread in playing:
            thread.start()
        time.sleep(0.3)  # the six keys spread over both replicas, generating
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            for thread in playing:
                thread.join(timeout=60)
            assert time.monotonic() - began < 45  # not the generation timeout
            assert sorted(answers) == [f"held-{i}" for i in range(6)]
            assert all(a.status_code == 200 for a in answers.values()), answers
            dropped = re.search(
                r"is unreachable \(/health: .*, (\d+) generation\(s\) in flight sent again",
                fleet.proxy.process.tail(200),
            )
            assert dropped is not None and int(dropped[1]) >= 1, fleet.proxy.process.tail(50)
            for version in (1, 2):
                perturb(model, seed=version)
                began = time.monotonic()
                assert sync.sync(model).version == version
                assert time.monotonic() - began < 30
            served = {f"policy@v{v}": str(sync.version_path(v)) for v in (1, 2)}
            assert slots(survivor.base_url) == served
            assert frozen.base_url.removesuffix("/v1") not in fleet.router.healthy()
            assert all(ask(fleet.base_url, f"key-{i}").status_code == 200 for i in range(6))
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while frozen.base_url.removesuffix("/v1") not in fleet.router.healthy():
            assert time.monotonic() < deadline, fleet.proxy.process.tail()
            time.sleep(0.5)
        assert slots(frozen.base_url) == served
        perturb(model, seed=3)
        assert sync.sync(model).version == 3
        served = {f"policy@v{v}": str(sync.version_path(v)) for v in (2, 3)}
        assert slots(frozen.base_url) == slots(survivor.base_url) == served
        assert "back in the router" in fleet.proxy.process.tail(200)
