"""The one form of every "this needs an extra" message (nemogym_sdk._extras)."""

from __future__ import annotations

import sys

import pytest

from nemogym_sdk import _extras


def test_a_message_names_the_modules_and_the_extra() -> None:
    message = _extras.needs("report_to", ["trackio"], "trackers", instead="or trackio alone")
    assert (
        message == "report_to needs trackio: pip install 'nemogym-sdk[trackers]' (or trackio alone)"
    )


def test_missing_torch_adds_how_to_get_its_cpu_build() -> None:
    message = _extras.needs("the reference trainer", ["torch", "peft", "tqdm"], "train")
    assert message.startswith("the reference trainer needs torch, peft and tqdm: ")
    assert message.endswith(f"pip install 'nemogym-sdk[train]' ({_extras.CPU_TORCH})")
    assert _extras.CPU_TORCH not in _extras.needs("x", ["peft"], "torch")
    assert "--index-url https://download.pytorch.org/whl/cpu" in _extras.CPU_TORCH  # not CUDA


def test_missing_is_what_cannot_be_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if not installed
    assert _extras.missing(["attrs", "yaml", "no_such_module_here"]) == [
        "yaml",
        "no_such_module_here",
    ]
