"""vLLM's runtime LoRA routes: load, reload in place, route by name, unload, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from .conftest import MODEL_NAME, make_server, peft_logprobs, save_random_lora

pytest.importorskip("transformers")
pytest.importorskip("peft")


MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two random non-zero LoRA adapters for the tiny model."""
    root = tmp_path_factory.mktemp("loras")
    return {name: save_random_lora(root / name, seed) for name, seed in (("v1", 1), ("v2", 2))}


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A scripted-mode server of its own (LoRA state is per server)."""
    running = make_server("scripted")
    yield running
    running.stop()


def post(server: Any, path: str, body: dict[str, Any]) -> requests.Response:
    """POST JSON to a route under /v1."""
    return requests.post(f"{server.base_url}/{path}", json=body, timeout=60)


def logprobs(server: Any, model: str) -> tuple[list[int], list[float]]:
    """The scripted answer's token ids and logprobs under ``model``."""
    response = post(
        server,
        "chat/completions",
        {"model": model, "messages": MESSAGES, "logprobs": True, "return_token_ids": True},
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def test_lora_load_route_reload_and_unload(server: Any, adapters: dict[str, Path]) -> None:
    """An adapter changes the logprobs by name; the base name keeps the base logprobs exactly."""
    base_ids, base = logprobs(server, MODEL_NAME)

    loaded = post(
        server, "load_lora_adapter", {"lora_name": "policy", "lora_path": str(adapters["v1"])}
    )
    assert loaded.status_code == 200
    assert loaded.text == "Success: LoRA adapter 'policy' added successfully."
    cards = {
        c["id"]: c for c in requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
    }
    assert cards["policy"]["root"] == str(adapters["v1"])
    assert cards["policy"]["parent"] == MODEL_NAME

    ids, v1 = logprobs(server, "policy")
    assert ids == base_ids
    assert max(abs(a - b) for a, b in zip(v1, base, strict=True)) > 1e-3
    prompt = requests.post(
        f"{server.url}/tokenize", json={"model": "policy", "messages": MESSAGES}, timeout=10
    )
    assert v1 == pytest.approx(
        peft_logprobs(adapters["v1"], prompt.json()["tokens"], ids), abs=1e-5
    )
    assert logprobs(server, MODEL_NAME)[1] == base

    again = post(
        server, "load_lora_adapter", {"lora_name": "policy", "lora_path": str(adapters["v2"])}
    )
    assert again.status_code == 400
    assert again.json()["error"]["type"] == "InvalidUserInput"
    assert "load_inplace" in again.json()["error"]["message"]

    inplace = post(
        server,
        "load_lora_adapter",
        {"lora_name": "policy", "lora_path": str(adapters["v2"]), "load_inplace": True},
    )
    assert inplace.status_code == 200
    v2 = logprobs(server, "policy")[1]
    assert v2 == pytest.approx(
        peft_logprobs(adapters["v2"], prompt.json()["tokens"], ids), abs=1e-5
    )
    assert max(abs(a - b) for a, b in zip(v2, v1, strict=True)) > 1e-3
    cards = {
        c["id"]: c for c in requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
    }
    assert cards["policy"]["root"] == str(adapters["v2"])

    other = post(
        server, "load_lora_adapter", {"lora_name": "other", "lora_path": str(adapters["v1"])}
    )
    assert other.status_code == 200
    assert logprobs(server, "other")[1] == pytest.approx(v1, abs=1e-6)
    assert logprobs(server, "policy")[1] == pytest.approx(v2, abs=1e-6)
    assert logprobs(server, MODEL_NAME)[1] == base

    removed = post(server, "unload_lora_adapter", {"lora_name": "policy"})
    assert removed.status_code == 200
    assert removed.text == "Success: LoRA adapter 'policy' removed successfully."
    gone = post(server, "chat/completions", {"model": "policy", "messages": MESSAGES})
    assert gone.status_code == 404
    assert gone.json()["error"]["message"] == "The model `policy` does not exist."
    assert logprobs(server, "other")[1] == pytest.approx(v1, abs=1e-6)

    assert post(server, "unload_lora_adapter", {"lora_name": "other"}).status_code == 200
    assert [
        c["id"] for c in requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
    ] == [MODEL_NAME]
    assert logprobs(server, MODEL_NAME)[1] == base


def test_lora_errors_are_http_errors(
    server: Any, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """Missing fields, unknown paths, bad configs, base-name clashes, unknown unloads: all fail."""
    missing = post(server, "load_lora_adapter", {"lora_name": "x"})
    assert missing.status_code == 400
    assert (
        missing.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
    )
    nowhere = post(
        server, "load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path / "no")}
    )
    assert nowhere.status_code == 404 and "No adapter found" in nowhere.text
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    bad = post(server, "load_lora_adapter", {"lora_name": "x", "lora_path": str(broken)})
    assert bad.status_code == 400
    clash = post(
        server, "load_lora_adapter", {"lora_name": MODEL_NAME, "lora_path": str(adapters["v1"])}
    )
    assert clash.status_code == 400 and "conflicts with a served base model" in clash.text
    unknown = post(server, "unload_lora_adapter", {"lora_name": "ghost"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "The lora adapter 'ghost' cannot be found."
    assert post(server, "unload_lora_adapter", {}).status_code == 400
    models = requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
    assert "x" not in [c["id"] for c in models]
