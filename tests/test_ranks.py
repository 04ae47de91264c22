"""``nemogym_sdk.ranks``: the main process acts, every rank learns the outcome.

Single-process behaviour, then two real ranks (``torch.distributed`` with gloo on
127.0.0.1, started with ``torch.multiprocessing.spawn``): the result of the main process's
action reaches the other rank, an error is raised on both (the same type and message for
the SDK's errors, which pickle), and neither hangs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk import ranks
from nemogym_sdk.errors import LoraSyncError
from nemogym_sdk.processes import free_loopback_ports


def test_single_process_runs_the_action_once() -> None:
    calls: list[int] = []
    assert ranks.on_main(lambda: calls.append(1) or 7) == 7
    assert calls == [1]
    assert ranks.on_main(lambda: calls.append(2), is_main=False) is None  # not the main one
    assert calls == [1]
    with pytest.raises(LoraSyncError, match="refused"):
        ranks.on_main(lambda: (_ for _ in ()).throw(LoraSyncError("refused", 400)))
    assert (ranks.rank(), ranks.world_size(), ranks.share("x"), ranks.gather(3)) == (0, 1, "x", [3])


class _UnpicklableError(Exception):
    def __init__(self, message: str, handle: Any) -> None:
        super().__init__(message)
        self.handle = handle

    def __reduce__(self) -> Any:
        raise TypeError("not picklable")


def _outcome(action: Any) -> dict[str, Any]:
    try:
        return {"value": ranks.on_main(action)}
    except Exception as exc:  # noqa: BLE001 - recorded for the test to compare
        return {"error": type(exc).__name__, "message": str(exc)}


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        seen = {
            "rank": ranks.rank(),
            "world": ranks.world_size(),
            "value": _outcome(lambda: {"version": 3, "by": ranks.rank()}),
            "sdk_error": _outcome(
                lambda: (_ for _ in ()).throw(LoraSyncError("server refused v4", 400))
            ),
            "foreign_error": _outcome(
                lambda: (_ for _ in ()).throw(_UnpicklableError("lock held", object()))
            ),
            "unpicklable_result": _outcome(lambda: lambda: None),
            "gathered": ranks.gather(rank * 10),
            "shared": ranks.share(f"from {rank}"),
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


def test_two_ranks_learn_the_main_process_outcome(tmp_path: Path) -> None:
    torch_mp = pytest.importorskip("torch.multiprocessing")
    torch_mp.spawn(_worker, args=(free_loopback_ports(1)[0], str(tmp_path)), nprocs=2, join=True)
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (main["rank"], other["rank"], main["world"]) == (0, 1, 2)
    # the result is the main process's, on both
    assert main["value"] == other["value"] == {"value": {"version": 3, "by": 0}}
    # an SDK error: the same type and message on both
    assert main["sdk_error"] == other["sdk_error"]
    assert main["sdk_error"]["error"] == "LoraSyncError"
    # an exception that does not pickle: the original on the main process, a RuntimeError
    # naming it on the other
    assert main["foreign_error"]["error"] == "_UnpicklableError"
    assert other["foreign_error"]["error"] == "RuntimeError"
    assert "_UnpicklableError: lock held" in other["foreign_error"]["message"]
    # a result that cannot be sent fails on both instead of hanging the other rank
    assert main["unpicklable_result"]["error"] != "" and "error" in other["unpicklable_result"]
    assert main["gathered"] == other["gathered"] == [0, 10]
    assert main["shared"] == other["shared"] == "from 0"
