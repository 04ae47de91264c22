"""LoraSync against our real server (a real PEFT model, real HTTP) and against FakeVLLM.

The real-server cases check what a trainer relies on: versions advance only when the
server confirms them, the served logprobs are exactly HF+PEFT's for the published
weights, failures carry the server's message and leave the served version alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest
import requests

from nemogym_sdk.errors import ConfigError, TransportError
from nemogym_sdk.lora import (
    LoraSync,
    LoraSyncError,
    LoraSyncHook,
    SyncRecord,
    install_lora_sync,
)
from nemogym_sdk.processes import free_loopback_ports

from .serve.conftest import peft_logprobs
from .test_lora_probe import FakeVLLM, openapi

MESSAGES = [{"role": "user", "content": "Say something."}]


def write_adapter(directory: Path, name: str = "adapter") -> Path:
    """A minimal adapter directory, enough for FakeVLLM (which never reads it)."""
    path = directory / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    return path


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    """A FakeVLLM with in-place support."""
    server = FakeVLLM().start()
    yield server
    server.stop()


# --- against FakeVLLM (no torch needed) ------------------------------------------------------


def test_push_uses_load_inplace_and_confirms(fake: FakeVLLM, tmp_path: Path) -> None:
    """First a plain load, then load_inplace; each version lands in its own directory, and
    each load names its version (``policy_version``, for ``nemogym_sdk.serve``)."""
    source = write_adapter(tmp_path)
    with LoraSync(fake.url, "policy", tmp_path / "out") as sync:
        first, second = sync.push(source), sync.push(source)
    assert (first.version, first.inplace, second.version, second.inplace) == (1, False, 2, True)
    out = (tmp_path / "out" / "policy").resolve()
    assert fake.posts() == [
        (
            "/v1/load_lora_adapter",
            {"lora_name": "policy", "lora_path": str(out / "v000001"), "policy_version": 1},
        ),
        (
            "/v1/load_lora_adapter",
            {
                "lora_name": "policy",
                "lora_path": str(out / "v000002"),
                "policy_version": 2,
                "load_inplace": True,
            },
        ),
    ]
    assert (out / "v000002" / "adapter_model.safetensors").read_bytes() == b"weights"
    assert fake.adapters == {"policy": str(out / "v000002")}


def test_server_without_inplace_gets_unload_then_load(fake: FakeVLLM, tmp_path: Path) -> None:
    """An openapi without ``load_inplace``: every replacement is unload, then a plain load."""
    fake.openapi = openapi(inplace=False)
    source = write_adapter(tmp_path)
    sync = LoraSync(fake.url, "policy", tmp_path / "out", keep=1)
    records = [sync.push(source) for _ in range(3)]
    assert [r.version for r in records] == [1, 2, 3]
    assert not any(r.inplace for r in records)
    routes = [path.rsplit("/", 1)[1] for path, _ in fake.posts()]
    assert routes == ["load_lora_adapter"] + ["unload_lora_adapter", "load_lora_adapter"] * 2
    assert all("load_inplace" not in body for _, body in fake.posts())
    assert sync.served_version() == 3
    assert sorted(os.listdir(sync.versions_dir)) == ["v000003"]


def test_unknown_routes_fall_back_to_unload_then_load(
    fake: FakeVLLM, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No /openapi.json: LoraSync still syncs, by unload then load, and logs that it does."""
    fake.openapi = None
    source = write_adapter(tmp_path)
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    sync.push(source)
    with caplog.at_level(logging.WARNING, logger="nemogym_sdk.lora"):
        sync.push(source)
        sync.push(source)
    assert [path for path, _ in fake.posts()][1:3] == [
        "/v1/unload_lora_adapter",
        "/v1/load_lora_adapter",
    ]
    (warning,) = [r for r in caplog.records if "unload then load" in r.getMessage()]
    assert "404" in warning.getMessage()
    assert sync.version == 3


def test_server_without_lora_routes_is_refused_before_writing(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """Routes listed but no LoRA ones: ConfigError with how to enable them; nothing sent."""
    fake.openapi = openapi(lora=False)
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    with pytest.raises(ConfigError, match="--enable-lora") as info:
        sync.push(write_adapter(tmp_path))
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in str(info.value)
    assert fake.posts() == [] and sync.version is None
    assert os.listdir(sync.versions_dir) == []


@pytest.mark.parametrize("style", ["nested", "flat", "text"])
def test_failed_inplace_load_keeps_the_version_and_restores_it(
    fake: FakeVLLM, tmp_path: Path, style: str
) -> None:
    """vLLM records a failed in-place path as the root; LoraSync loads the last version back."""
    fake.error_style = style
    fake.mutate_on_failure = True
    source = write_adapter(tmp_path)
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    sync.push(source)
    fake.fail_next = (
        500,
        "Worker failed with error 'LoRA rank 16 is greater than max_lora_rank 8.'",
    )
    with pytest.raises(LoraSyncError) as info:
        sync.push(source)
    error = info.value
    assert error.status == 500
    assert error.server_message.endswith("max_lora_rank 8.'")
    assert "version 2" in str(error) and "--max-lora-rank" in str(error)
    assert "Version 1 was loaded again" in str(error)
    assert sync.version == 1 and sync.served_version() == 1
    assert fake.posts()[-1][1]["lora_path"].endswith("v000001")
    assert sync.push(source).version == 2  # the failed number is reused, not skipped


def test_failed_load_after_unload_loads_the_last_version_again(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """Without in-place, a failed load follows an unload: the last version is loaded again."""
    fake.openapi = openapi(inplace=False)
    source = write_adapter(tmp_path)
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    sync.push(source)
    fake.fail_next = (404, "No adapter found for /nowhere")
    with pytest.raises(LoraSyncError, match="same path") as info:
        sync.push(source)
    assert info.value.status == 404
    assert "Version 1 was loaded again and is served." in str(info.value)
    assert sync.served_version() == 1


def test_first_load_failure_says_nothing_was_served(fake: FakeVLLM, tmp_path: Path) -> None:
    """A failure before any version was confirmed: no version, and the error says so."""
    fake.fail_next = (400, "Invalid LoRA adapter")
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    with pytest.raises(LoraSyncError, match="No earlier version"):
        sync.push(write_adapter(tmp_path))
    assert sync.version is None and sync.history == ()


def test_unconfirmed_load_raises(fake: FakeVLLM, tmp_path: Path) -> None:
    """A 200 that did not change /v1/models is not a sync: LoraSyncError, version unchanged."""
    source = write_adapter(tmp_path)
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    sync.push(source)
    fake.ignore_loads = True
    with pytest.raises(LoraSyncError, match="not confirmed") as info:
        sync.push(source)
    assert info.value.status == 0
    assert sync.version == 1


@pytest.fixture
def replicas() -> Iterator[list[FakeVLLM]]:
    """Two FakeVLLMs serving one policy."""
    servers = [FakeVLLM().start(), FakeVLLM().start()]
    yield servers
    for server in servers:
        server.stop()


def test_replicas_each_get_every_version(replicas: list[FakeVLLM], tmp_path: Path) -> None:
    """``LoraSync([a, b])`` loads and confirms each version on both; both serve it."""
    sync = LoraSync([r.url + "/v1" for r in replicas], "policy", tmp_path / "out")
    assert sync.base_urls == tuple(r.url for r in replicas) and sync.base_url == replicas[0].url
    source = write_adapter(tmp_path)
    for version in (1, 2):
        assert sync.push(source).version == version
        assert sync.served_versions() == {r.url: version for r in replicas}
    assert sync.served_version() == 2
    for replica in replicas:
        loads = [b for path, b in replica.posts() if path == "/v1/load_lora_adapter"]
        assert [b["policy_version"] for b in loads] == [1, 2]
    assert sync.versions_kept() is None  # vLLM does not say how many it keeps


def test_a_replica_that_refuses_leaves_all_on_the_last_version(
    replicas: list[FakeVLLM], tmp_path: Path
) -> None:
    """Replica b refuses version 2: a, which had loaded it, loads version 1 again; the error
    names b and says what each replica serves; the number is reused by the next publish."""
    first, second = replicas
    sync = LoraSync([first.url, second.url], "policy", tmp_path / "out")
    source = write_adapter(tmp_path)
    sync.push(source)
    second.fail_next = (400, "no room for another adapter")
    with pytest.raises(LoraSyncError) as info:
        sync.push(source)
    message = str(info.value)
    assert message.startswith(f"replica {second.url}: load of LoRA adapter 'policy' version 2")
    assert "no room for another adapter" in message and info.value.status == 400
    assert f"Version 1 was loaded again and is served on {first.url}." in message
    assert sync.version == 1 and sync.served_versions() == {first.url: 1, second.url: 1}
    assert first.posts()[-1][1]["lora_path"].endswith("v000001")
    assert sync.push(source).version == 2
    assert sync.served_version() == 2


def test_a_replica_that_does_not_confirm_is_undone_everywhere(
    replicas: list[FakeVLLM], tmp_path: Path
) -> None:
    """Replica b answers 200 but does not serve the new version: both go back to version 1."""
    first, second = replicas
    sync = LoraSync([first.url, second.url], "policy", tmp_path / "out")
    source = write_adapter(tmp_path)
    sync.push(source)
    second.ignore_loads = True
    with pytest.raises(LoraSyncError, match=rf"replica {second.url}: .*not confirmed"):
        sync.push(source)
    assert sync.served_versions() == {first.url: 1, second.url: 1}


def test_an_unreachable_replica_fails_the_publish_and_the_others_go_back(
    replicas: list[FakeVLLM], tmp_path: Path
) -> None:
    """Replica b is gone: a TransportError naming it; a serves version 1 again."""
    first, second = replicas
    sync = LoraSync([first.url, second.url], "policy", tmp_path / "out", timeout=5)
    source = write_adapter(tmp_path)
    sync.push(source)
    second.stop()
    with pytest.raises(TransportError, match=rf"replica {second.url}: ") as info:
        sync.push(source)
    assert f"served on {first.url}" in str(info.value)
    assert sync.version == 1 and first.adapters["policy"].endswith("v000001")


def test_replicas_that_disagree_are_reported(replicas: list[FakeVLLM], tmp_path: Path) -> None:
    first, second = replicas
    sync = LoraSync([first.url, second.url], "policy", tmp_path / "out")
    sync.push(write_adapter(tmp_path))
    second.adapters["policy"] = str(sync.version_path(7))  # another process loaded something
    with pytest.raises(LoraSyncError, match=rf"different versions.*{second.url}: 7"):
        sync.served_version()


def test_unreachable_server_is_a_transport_error(tmp_path: Path) -> None:
    """A server that went away: TransportError, and the version does not move."""
    fake = FakeVLLM().start()
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    source = write_adapter(tmp_path)
    sync.push(source)
    fake.stop()
    with pytest.raises(TransportError):
        sync.push(source)
    assert sync.version == 1


def test_existing_adapter_is_replaced_in_place(fake: FakeVLLM, tmp_path: Path) -> None:
    """An adapter loaded before this LoraSync existed (an earlier run) is swapped in place."""
    fake.adapters["policy"] = "/earlier/run/v000009"
    sync = LoraSync(fake.url, "policy", tmp_path / "out")
    assert sync.served_version() is None  # not one of ours
    record = sync.push(write_adapter(tmp_path))
    assert record.inplace and fake.posts()[0][1]["load_inplace"] is True


def test_leftover_version_directories_are_replaced_and_pruned(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """Directories of an earlier run never shadow new versions and are pruned."""
    out = tmp_path / "out" / "policy"
    for leftover in ("v000001", "v000007"):
        (out / leftover).mkdir(parents=True)
        (out / leftover / "stale").write_text("old")
    (out / "notes.txt").write_text("kept: not a version directory")
    sync = LoraSync(fake.url, "policy", tmp_path / "out", keep=1)
    sync.push(write_adapter(tmp_path))
    assert sorted(os.listdir(out)) == ["notes.txt", "v000001"]
    assert not (out / "v000001" / "stale").exists()


def test_arguments_are_checked(tmp_path: Path) -> None:
    """Bad names, keep and timeout are ConfigErrors; an unwritable directory says so."""
    for name in ("", " policy", "a/b", ".."):
        with pytest.raises(ConfigError):
            LoraSync("http://127.0.0.1:1", name, tmp_path)
    with pytest.raises(ConfigError, match="keep"):
        LoraSync("http://127.0.0.1:1", "policy", tmp_path, keep=0)
    with pytest.raises(ConfigError, match="timeout"):
        LoraSync("http://127.0.0.1:1", "policy", tmp_path, timeout=0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write LoRA adapters under"):
        LoraSync("http://127.0.0.1:1", "policy", blocker / "sub")
    with pytest.raises(ConfigError, match=r"adapter_config\.json"):
        LoraSync("http://127.0.0.1:1", "policy", tmp_path / "out").push(tmp_path)


def test_repr_close_and_session(tmp_path: Path) -> None:
    """The repr says url, name and version; a caller's session is never closed."""
    session = MagicMock(spec=requests.Session)
    sync = LoraSync("http://127.0.0.1:8000/v1", "policy", tmp_path, session=session)
    assert repr(sync).startswith(
        "LoraSync(base_url='http://127.0.0.1:8000', adapter_name='policy', version=None"
    )
    sync.close()
    session.close.assert_not_called()
    with LoraSync("http://127.0.0.1:8000", "policy", tmp_path) as owned:
        assert owned.version is None


def test_import_stays_light_and_torch_is_named_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nemogym_sdk.lora imports no torch/peft; saving without peft names the extra."""
    code = (
        "import sys, nemogym_sdk.lora; "
        "print(','.join(m for m in ('torch', 'peft', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    monkeypatch.setitem(sys.modules, "peft", None)
    sync = LoraSync("http://127.0.0.1:1", "policy", tmp_path)
    with pytest.raises(ImportError, match=r"pip install 'nemogym-sdk\[torch\]'"):
        sync.initialize(object())


# --- hooks -----------------------------------------------------------------------------------


class Generation:
    """A stand-in for TRL's VLLMGeneration: sync_weights is a method of the class."""

    def sync_weights(self) -> str:
        return "class method"


def test_hook_delegates_and_remove_restores_exactly() -> None:
    """Instance attribute in, instance attribute out; the class is never touched."""
    calls: list[str] = []
    generation = Generation()
    trainer = SimpleNamespace(
        _sync_lora_adapter=lambda: calls.append("trainer"), vllm_generation=generation
    )
    hook = install_lora_sync(trainer)
    assert isinstance(hook, LoraSyncHook) and hook.installed
    assert "sync_weights" in vars(generation)
    generation.sync_weights()
    assert calls == ["trainer"]
    assert Generation().sync_weights() == "class method"  # other instances untouched
    hook.remove()
    assert "sync_weights" not in vars(generation)
    assert generation.sync_weights() == "class method"
    hook.remove()  # idempotent
    assert not hook.installed and "removed" in repr(hook)


def test_hook_restores_an_instance_attribute_and_a_mock_child() -> None:
    """An attribute the instance had of its own (or a mock's child) comes back as it was."""
    original = MagicMock(name="original")
    generation = SimpleNamespace(sync_weights=original)
    with install_lora_sync(
        SimpleNamespace(_sync_lora_adapter=lambda: None, vllm_generation=generation)
    ):
        assert generation.sync_weights is not original
    assert generation.sync_weights is original

    mocked = MagicMock()
    child = mocked.sync_weights
    trainer = MagicMock()
    trainer.vllm_generation = mocked
    hook = install_lora_sync(trainer)
    mocked.sync_weights()
    trainer._sync_lora_adapter.assert_called_once()
    child.assert_not_called()
    hook.remove()
    assert mocked.sync_weights is child


def test_hook_leaves_a_later_replacement(caplog: pytest.LogCaptureFixture) -> None:
    """If someone replaced the hook after us, remove() keeps theirs and says so."""
    generation = Generation()
    hook = install_lora_sync(
        SimpleNamespace(_sync_lora_adapter=lambda: None, vllm_generation=generation)
    )
    theirs = lambda: "theirs"  # noqa: E731
    generation.sync_weights = theirs  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="nemogym_sdk.lora"):
        hook.remove()
    assert generation.sync_weights is theirs
    assert "replaced" in caplog.text


def test_hook_needs_a_generation_and_something_to_call() -> None:
    """No vllm_generation, or neither _sync_lora_adapter nor a LoraSync: ConfigError."""
    with pytest.raises(ConfigError, match="vllm_generation"):
        install_lora_sync(SimpleNamespace())
    with pytest.raises(ConfigError, match="pass a LoraSync"):
        install_lora_sync(SimpleNamespace(vllm_generation=Generation()))


def test_hook_syncs_on_the_main_process_only(fake: FakeVLLM, tmp_path: Path) -> None:
    """A LoraSync hook publishes on the main process; other ranks send nothing."""
    published: list[object] = []
    sync = SimpleNamespace(sync=published.append)
    model = object()
    main = SimpleNamespace(
        model=model,
        accelerator=SimpleNamespace(is_main_process=True),
        vllm_generation=Generation(),
    )
    other = SimpleNamespace(
        model=model,
        accelerator=SimpleNamespace(is_main_process=False),
        vllm_generation=Generation(),
    )
    install_lora_sync(main, sync)  # type: ignore[arg-type]
    install_lora_sync(other, sync)  # type: ignore[arg-type]
    main.vllm_generation.sync_weights()
    other.vllm_generation.sync_weights()
    assert published == [model]


def _rank(rank: int, port: int, results: Any) -> None:
    """One rank of a 2-process gloo group whose rank 0 sync fails."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

    def fail(model: object) -> None:
        raise LoraSyncError("load failed: HTTP 400: Invalid LoRA adapter", 400)

    trainer = SimpleNamespace(model=None, vllm_generation=Generation())
    install_lora_sync(trainer, SimpleNamespace(sync=fail))  # type: ignore[arg-type]
    try:
        trainer.vllm_generation.sync_weights()
        results.put((rank, "returned"))
    except LoraSyncError as exc:
        results.put((rank, str(exc)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_failed_sync_fails_every_rank() -> None:
    """Rank 0's failure reaches rank 1 through the barrier: nobody waits forever (W-SYNC-3)."""
    pytest.importorskip("torch")
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    (port,) = free_loopback_ports(1)
    ranks = [context.Process(target=_rank, args=(r, port, results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
        assert process.exitcode == 0
    outcomes = dict(results.get(timeout=5) for _ in ranks)
    # every rank raises the main process's own LoraSyncError (it pickles), same message
    assert outcomes[0] == outcomes[1] == "load failed: HTTP 400: Invalid LoRA adapter"


# --- against our real server, with a real PEFT model -----------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A scripted-mode server of this module's own (the answer's tokens are fixed)."""
    pytest.importorskip("peft")
    from .serve.conftest import make_server

    running = make_server("scripted")
    yield running
    running.stop()


def peft_model(adapter_name: str = "default") -> Any:
    """The tiny model with a fresh r=4 LoRA on q_proj and v_proj (B = 0: PEFT's init)."""
    from peft import LoraConfig, get_peft_model

    from nemogym_sdk.serve.tiny import build_tiny_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        return get_peft_model(build_tiny_model(0), config, adapter_name=adapter_name)


def perturb(model: Any, seed: int, *, only_first: bool = False) -> None:
    """Give the LoRA weights random values (what a few optimizer steps would do)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
                if only_first and "lora_B" in name:
                    return


def served(server: Any, model: str) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, scripted answer ids, their logprobs) under ``model``."""
    body = {"model": model, "messages": MESSAGES, "logprobs": True, "return_token_ids": True}
    response = requests.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    data = response.json()
    choice = data["choices"][0]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    return data["prompt_token_ids"], choice["token_ids"], logprobs


def card_root(server: Any, name: str) -> str | None:
    cards = requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
    return next((c["root"] for c in cards if c["id"] == name), None)


def test_initialize_then_sync_serves_each_version(server: Any, tmp_path: Path) -> None:
    """Versions 0..3: served, confirmed, pruned, and sampled with exactly their weights."""
    model = peft_model("policy")  # a non-default adapter name: PEFT saves it in a subdir
    sync = LoraSync(server.base_url, "policy", tmp_path, keep=2)
    prompt, ids, base = served(server, "tiny")

    zero = sync.initialize(model)
    assert isinstance(zero, SyncRecord)
    assert (zero.version, zero.inplace, zero.adapter_name) == (0, False, "policy")
    assert zero.path == str(tmp_path.resolve() / "policy" / "v000000")
    assert card_root(server, "policy") == zero.path and sync.served_version() == 0
    assert served(server, "policy")[2] == pytest.approx(base, abs=1e-6)  # zero adapter = base

    previous = base
    for step in (1, 2, 3):
        perturb(model, seed=step)
        record = sync.sync(model)
        assert (record.version, record.inplace) == (step, True)
        assert sync.version == step and sync.served_version() == step
        assert card_root(server, "policy") == record.path
        assert min(record.save_s, record.load_s, record.confirm_s) >= 0
        assert record.total_s >= record.save_s + record.load_s + record.confirm_s
        _, served_ids, now = served(server, "policy")
        assert served_ids == ids
        assert max(abs(a - b) for a, b in zip(now, previous, strict=True)) > 1e-3
        assert now == pytest.approx(peft_logprobs(record.path, prompt, ids), abs=1e-5)
        previous = now

    assert [r.version for r in sync.history] == [0, 1, 2, 3]
    assert sorted(os.listdir(tmp_path / "policy")) == ["v000002", "v000003"]
    assert served(server, "tiny")[2] == base  # the base model is untouched


def test_require_zero_catches_a_nonzero_b(server: Any, tmp_path: Path) -> None:
    """initialize() refuses an adapter that is not the base model, naming the weight."""
    model = peft_model()
    perturb(model, seed=5, only_first=True)
    sync = LoraSync(server.base_url, "resumed", tmp_path)
    with pytest.raises(ConfigError) as info:
        sync.initialize(model)
    message = str(info.value)
    assert "lora_B.default.weight" in message and "require_zero=False" in message
    assert sync.version is None and card_root(server, "resumed") is None
    assert os.listdir(tmp_path / "resumed") == []

    assert sync.initialize(model, require_zero=False).version == 0
    with pytest.raises(ConfigError, match="already published"):
        sync.initialize(model)


def test_initialize_reads_a_gathered_state_dict_not_the_models_slices(
    server: Any, tmp_path: Path
) -> None:
    """A sharded model's rank 0 holds slices; the gathered state dict it passes is what
    ``require_zero`` checks and what is published."""
    import torch
    from safetensors.torch import load_file

    model = peft_model()
    whole = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    perturb(model, seed=5, only_first=True)  # the model's own B is no longer zero
    sync = LoraSync(server.base_url, "gathered", tmp_path)
    nonzero = {n: t + 1 if "lora_B" in n else t for n, t in whole.items()}
    with pytest.raises(ConfigError, match=r"lora_B\.default\.weight"):
        sync.initialize(model, state_dict=nonzero)
    record = sync.initialize(model, state_dict=whole)
    saved = load_file(str(Path(record.path) / "adapter_model.safetensors"))
    assert len(saved) == len(whole) > 0
    for name, tensor in whole.items():
        assert torch.equal(saved[name.replace(".default", "")], tensor)


def test_a_resumed_run_starts_at_its_checkpoints_version(server: Any, tmp_path: Path) -> None:
    """initialize(version=k): a resumed run publishes its checkpoint's adapter as version k
    and goes on with k + 1, the sequence of a run that was never stopped."""
    model = peft_model()
    perturb(model, seed=3)
    sync = LoraSync(server.base_url, "resumed", tmp_path)
    with pytest.raises(ConfigError, match=">= 0"):
        sync.initialize(model, require_zero=False, version=-1)
    assert sync.initialize(model, require_zero=False, version=4).version == 4
    assert sync.served_version() == 4
    assert sync.sync(model).version == 5 and sync.served_version() == 5


def test_failed_loads_carry_the_servers_message(server: Any, tmp_path: Path) -> None:
    """A corrupt adapter and one for another base: 400 with the server's words; v1 stays."""
    from safetensors.torch import save_file

    model = peft_model()
    sync = LoraSync(server.base_url, "fails", tmp_path / "out")
    sync.initialize(model)
    perturb(model, seed=1)
    good = sync.sync(model)
    before = served(server, "fails")[2]

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoraSyncError) as info:
        sync.push(corrupt)
    assert info.value.status == 400
    assert info.value.server_message.startswith("Invalid LoRA adapter at ")
    assert "The server still serves version 1." in str(info.value)
    assert sync.version == 1 and sync.served_version() == 1

    import torch

    wrong_base = tmp_path / "wrong-base"
    shutil.copytree(good.path, wrong_base)
    from safetensors.torch import load_file

    tensors = load_file(str(wrong_base / "adapter_model.safetensors"))
    save_file(
        {k: torch.zeros(3, 3) for k in tensors}, str(wrong_base / "adapter_model.safetensors")
    )
    with pytest.raises(LoraSyncError) as info:
        sync.push(wrong_base)
    assert info.value.status == 400
    assert info.value.server_message.startswith("Failed to load LoRA adapter 'fails'")
    assert sync.version == 1 and sync.served_version() == 1
    assert served(server, "fails")[2] == pytest.approx(before, abs=1e-6)

    assert sync.sync(model).version == 2


def test_push_serves_an_adapter_saved_elsewhere(server: Any, tmp_path: Path) -> None:
    """push() copies a saved adapter in as the next version and serves exactly it."""
    from .serve.conftest import save_random_lora

    source = save_random_lora(tmp_path / "saved", seed=3)
    sync = LoraSync(server.base_url, "pushed", tmp_path / "out")
    record = sync.push(source)
    assert record.version == 1 and Path(record.path).parent == sync.versions_dir
    prompt, ids, logprobs = served(server, "pushed")
    assert logprobs == pytest.approx(peft_logprobs(str(source), prompt, ids), abs=1e-5)


def test_sync_rejects_a_model_without_lora(server: Any, tmp_path: Path) -> None:
    """A plain transformers model is not an adapter: ConfigError naming get_peft_model."""
    from nemogym_sdk.serve.tiny import build_tiny_model

    sync = LoraSync(server.base_url, "plain", tmp_path)
    with pytest.raises(ConfigError, match="get_peft_model"):
        sync.sync(build_tiny_model(0))
    assert sync.version is None


def test_hook_drives_lora_sync_on_a_real_model(server: Any, tmp_path: Path) -> None:
    """trainer.vllm_generation.sync_weights() publishes the trainer's model."""
    model = peft_model()
    sync = LoraSync(server.base_url, "hooked", tmp_path)
    sync.initialize(model)
    trainer = SimpleNamespace(model=model, vllm_generation=Generation())
    with install_lora_sync(trainer, sync):
        perturb(model, seed=9)
        trainer.vllm_generation.sync_weights()
    assert sync.version == 1 and sync.served_version() == 1
    assert trainer.vllm_generation.sync_weights() == "class method"
