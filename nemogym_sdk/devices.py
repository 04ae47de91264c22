"""Device settings (``auto``, ``cpu``, ``cuda``, ``cuda:N``): parsed here, once.

``parse_device`` checks the spelling (pure: configs validate with it without torch);
``torch_device`` turns a setting into the ``torch.device`` a process uses, importing torch
only when called. The reference trainer's learner and ``nemogym_sdk.serve``'s sampler both
go through them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from nemogym_sdk.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["DEVICES", "parse_device", "torch_device"]

DEVICES = "auto, cpu, cuda or cuda:N"
"""The device settings accepted (``auto``: CUDA when torch sees a GPU, else the CPU)."""

_SPELLING = re.compile(r"auto|cpu|cuda(:\d+)?")


def parse_device(spec: str) -> str:
    """``spec`` normalised (stripped, lower case); ``ConfigError`` for another spelling.

    >>> parse_device(" CUDA:1 ")
    'cuda:1'
    """
    text = spec.strip().lower() if isinstance(spec, str) else ""
    if not _SPELLING.fullmatch(text):
        raise ConfigError(f"device must be one of {DEVICES}, got {spec!r}")
    return text


def torch_device(spec: str, *, local_rank: int = 0, world: int = 1) -> torch.device:
    """The torch device for ``spec``; with several processes (``world > 1``) a bare
    ``cuda`` becomes ``cuda:<local_rank>`` (modulo the GPUs visible).

    Raises ``ConfigError`` for another spelling, for CUDA when torch has none (saying what
    to install), and for a GPU index that is not visible.
    """
    import torch

    text = parse_device(spec)
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(text)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build "
            "(e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu128`, "
            "see https://pytorch.org/get-started/locally/)"
            if torch.version.cuda is None
            else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU; check "
            "the NVIDIA driver (`nvidia-smi`) and CUDA_VISIBLE_DEVICES"
        )
        raise ConfigError(f"device {spec!r} needs CUDA, but {why}; or use device cpu")
    count = torch.cuda.device_count()
    if device.index is None and world > 1:
        return torch.device("cuda", local_rank % count)
    if device.index is not None and device.index >= count:
        raise ConfigError(f"device {spec!r}: torch sees {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device
