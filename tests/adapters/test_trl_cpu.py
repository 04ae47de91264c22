"""``run_async_grpo_on_cpu``: TRL's tree attention on plain torch (`CpuVarlenAttention`).

Each packed segment attends to the keys of its root-to-segment path, causally, aligned at
the end: for two sequences sharing a prefix, packed as prefix, branch A, branch B, every
row equals plain causal attention over the whole sequence it belongs to. TRL's trainer
running on it against real NeMo Gym is ``tests/gym/test_trl_async.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from nemogym_sdk.adapters.trl import CpuVarlenAttention, run_async_grpo_on_cpu  # noqa: E402
from nemogym_sdk.errors import ConfigError  # noqa: E402
from tests.gym.trl_async import on_cpu  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'")


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention over one sequence, (tokens, heads, dim), GQA repeated."""
    repeat = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(repeat, dim=1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1)


def test_a_packed_tree_attends_as_each_whole_sequence_does() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(7, 4, 8, generator=generator)  # rows 0-2 the prefix, 3-4 A, 5-6 B
    k, v = (torch.randn(7, 2, 8, generator=generator) for _ in range(2))
    paths = [[0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 5, 6]]
    kv_index = torch.tensor([i for path in paths for i in path])
    out = CpuVarlenAttention.flash_attn_varlen_func(
        q,
        k.index_select(0, kv_index),
        v.index_select(0, kv_index),
        torch.tensor([0, 3, 5, 7], dtype=torch.int32),
        torch.tensor([0, 3, 8, 13], dtype=torch.int32),
        3,
        5,
        softmax_scale=None,
        causal=True,
    )
    for branch in ([0, 1, 2, 3, 4], [0, 1, 2, 5, 6]):
        whole = causal(q[branch], k[branch], v[branch])
        torch.testing.assert_close(out[branch], whole, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="sliding window"):
        CpuVarlenAttention.flash_attn_varlen_func(
            q, k, v, torch.tensor([0, 7]), torch.tensor([0, 7]), 7, 7, window_size=(4, 0)
        )


def test_run_async_grpo_on_cpu_names_what_this_trl_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    on_cpu(monkeypatch)
    assert packing._flash_attn() is CpuVarlenAttention
    assert async_grpo_trainer.get_peak_flops_per_device(None, "float32") is None  # MFU off
    monkeypatch.delattr(packing, "_flash_attn")
    with pytest.raises(ConfigError, match="_flash_attn"):
        run_async_grpo_on_cpu()
