"""Transformers causal-LM backend: render prompts, sample with logprobs, score forced tokens, LoRA.

Not thread-safe: the HTTP layer runs every call on one worker thread, one request at a time.
Logprobs follow vLLM's ``--logprobs-mode`` (see `nemogym_sdk.serve.sampling`): ``raw_logprobs``
(the default) is the model's log-softmax whatever the sampling parameters; ``processed_logprobs``
is the log-softmax of the distribution the token was drawn from (temperature, top-k, top-p
applied), which is what a learner's importance ratio must be compared with.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve._deps import require_serve_deps

require_serve_deps()

import torch  # noqa: E402

from nemogym_sdk.serve.errors import BadRequestError, NotFoundError  # noqa: E402
from nemogym_sdk.serve.interface import Generation  # noqa: E402
from nemogym_sdk.serve.protocol import SamplingParams, TokenLogprob  # noqa: E402
from nemogym_sdk.serve.sampling import (  # noqa: E402
    MASKED_LOGPROB,
    LogprobsMode,
    is_greedy,
    process_logits,
)
from nemogym_sdk.serve.template import ChatTemplate, eos_ids_of  # noqa: E402

__all__ = ["DEVICES", "CausalLMBackend", "Generation", "resolve_device"]

logger = logging.getLogger(__name__)

DEVICES = "auto, cpu, cuda or cuda:N"
"""The device settings `resolve_device` accepts (``auto``: CUDA when torch sees a GPU)."""


def resolve_device(spec: str) -> torch.device:
    """The torch device for ``spec`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

    Raises ``ConfigError`` for another spelling, for CUDA when torch has none (saying what to
    install), and for a GPU index that is not visible.
    """
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", spec):
        raise ConfigError(f"device must be one of {DEVICES}, got {spec!r}")
    device = torch.device(spec)
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
    if device.index is not None and device.index >= count:
        raise ConfigError(f"device {spec!r}: torch sees {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device


class CausalLMBackend:
    """One causal LM and its tokenizer, plus named LoRA adapters (PEFT)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name_or_path: str,
        max_model_len: int | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        """Wrap a loaded ``transformers`` model (eval mode, moved to ``device``) and fast
        tokenizer; ``device`` is a torch device or a `resolve_device` setting."""
        generation_config = getattr(model, "generation_config", None)
        self.template = ChatTemplate(
            tokenizer,
            eos_token_ids=eos_ids_of(tokenizer, getattr(generation_config, "eos_token_id", None)),
            name=name_or_path,
        )
        """The tokenizer and chat template: rendering, tokenizing, the prefix splice."""
        self.device: torch.device = (
            device if isinstance(device, torch.device) else resolve_device(device)
        )
        """Where the model runs; prompts, sampling and LoRA adapters live there too."""
        self.model: Any = model.to(self.device).eval()
        self.tokenizer: Any = tokenizer
        self.name_or_path = name_or_path
        config = model.config
        self.vocab_size: int = int(config.vocab_size)
        self.max_model_len: int = int(
            max_model_len or getattr(config, "max_position_embeddings", None) or 2048
        )
        self.eos_token_ids: frozenset[int] = self.template.eos_token_ids
        """Every token id that ends a generation."""
        self.eos_token_id: int = self.template.eos_token_id
        """The EOS a scripted turn ends with (the tokenizer's own)."""
        self._peft: Any = None
        self._adapter_paths: dict[str, str] = {}
        forward_params = inspect.signature(type(model).forward).parameters
        # transformers renamed past_key_values -> cache (5.2x); older releases lack logits_to_keep.
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in forward_params

    @classmethod
    def tiny(cls, seed: int = 0, *, device: str | torch.device = "cpu") -> CausalLMBackend:
        """Return the in-process tiny model (see `nemogym_sdk.serve.tiny`)."""
        from nemogym_sdk.serve.tiny import TINY_MODEL_NAME, build_tiny_model, build_tiny_tokenizer

        return cls(
            build_tiny_model(seed),
            build_tiny_tokenizer(),
            name_or_path=TINY_MODEL_NAME,
            device=device,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_model_len: int | None = None,
        device: str | torch.device = "cpu",
    ) -> CausalLMBackend:
        """Load a local model directory (weights + tokenizer with a chat template) in fp32 on
        ``device`` (default the CPU)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"Model directory not found: {directory}")
        target = device if isinstance(device, torch.device) else resolve_device(device)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        return cls(
            model,
            tokenizer,
            name_or_path=str(directory),
            max_model_len=max_model_len,
            device=target,
        )

    # ----------------------------------------------------------------- tokens and templates

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Tokenize plain text."""
        return self.template.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize, skipping special tokens (as vLLM does for ``content``)."""
        return self.template.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        """Return one token decoded on its own (special tokens spelled out)."""
        return self.template.token_text(token_id)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Render ``messages`` through the chat template and tokenize (no splice)."""
        return self.template.render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )

    def prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Return the prompt for ``messages`` with the on-policy prefix splice applied."""
        return self.template.prompt_ids(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )

    def check_prompt(self, prompt_ids: Sequence[int], max_tokens: int | None) -> int:
        """Validate a prompt against the vocabulary and context; return the token budget.

        Raises `BadRequestError` with vLLM's "maximum context length" wording on overflow.
        """
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequestError(
                f"Token id {bad[0]} is out of vocabulary (size {self.vocab_size})."
            )
        n, limit = len(prompt_ids), self.max_model_len
        if n >= limit:
            raise BadRequestError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {n} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        if max_tokens is None:
            return limit - n
        if n + max_tokens > limit:
            raise BadRequestError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {limit} tokens and your request has {n} input tokens "
                f"({max_tokens} > {limit} - {n}).",
                param="max_tokens",
            )
        return max_tokens

    # ----------------------------------------------------------------- generation

    def _entry(self, token_id: int, logprobs_V: torch.Tensor, top_k: int) -> TokenLogprob:
        top: tuple[tuple[int, float, str], ...] = ()
        if top_k > 0:
            values, indices = torch.topk(logprobs_V, k=min(top_k, logprobs_V.shape[-1]))
            top = tuple(
                (int(i), float(v), self.token_text(int(i)))
                for v, i in zip(values.tolist(), indices.tolist(), strict=True)
            )
        return TokenLogprob(
            token_id=token_id,
            logprob=_finite(float(logprobs_V[token_id])),
            text=self.token_text(token_id),
            top=tuple((i, _finite(v), text) for i, v, text in top),
        )

    def _forward(
        self,
        model: Any,
        input_ids_1T: torch.Tensor,
        keep: int,
        cache: Any = None,
        *,
        use_cache: bool = True,
    ) -> Any:
        kwargs: dict[str, Any] = {"input_ids": input_ids_1T, "use_cache": use_cache}
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        return model(**kwargs)

    @staticmethod
    def _cache_of(out: Any) -> Any:
        cache = getattr(out, "cache", None)  # transformers >= 5.2x
        return cache if cache is not None else getattr(out, "past_key_values", None)

    def sample(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        seed: int,
        adapter: str | None = None,
        top_logprobs: int = 0,
        logprobs_mode: LogprobsMode = "raw_logprobs",
    ) -> Generation:
        """Generate until EOS, a stop string/token, or ``params.max_tokens`` (KV-cached).

        Each token's logprob follows ``logprobs_mode`` (raw, or of the processed distribution).
        """
        budget = self.check_prompt(prompt_ids, params.max_tokens)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        stop_ids = set(params.stop_token_ids)
        tokens: list[TokenLogprob] = []
        with self._active(adapter) as model, torch.inference_mode():
            prompt_1T = torch.tensor([list(prompt_ids)], device=self.device)
            out = self._forward(model, prompt_1T, keep=1)
            for step in range(budget):
                logits_V = out.logits[0, -1].float()
                processed_V = _process(logits_V, params)
                token = _pick(processed_V, params, generator)
                reported_V = processed_V if logprobs_mode == "processed_logprobs" else logits_V
                logprobs_V = torch.log_softmax(reported_V, dim=-1)
                tokens.append(self._entry(token, logprobs_V, top_logprobs))
                if token in self.eos_token_ids and not params.ignore_eos:
                    return Generation(tokens=tuple(tokens), finish_reason="stop")
                if token in stop_ids:
                    return Generation(tokens=tuple(tokens), finish_reason="stop", stop_reason=token)
                if params.stop:
                    text = self.decode([t.token_id for t in tokens])
                    hits = [(text.find(s), s) for s in params.stop if s in text]
                    if hits:
                        at, which = min(hits)
                        return Generation(
                            tokens=tuple(tokens),
                            finish_reason="stop",
                            stop_reason=which,
                            text_end=at,
                        )
                if step + 1 < budget:
                    next_1T = torch.tensor([[token]], device=self.device)
                    out = self._forward(model, next_1T, keep=1, cache=self._cache_of(out))
        return Generation(tokens=tuple(tokens), finish_reason="length")

    def score(
        self,
        prompt_ids: Sequence[int],
        forced_ids: Sequence[int],
        *,
        adapter: str | None = None,
        top_logprobs: int = 0,
        params: SamplingParams | None = None,
        logprobs_mode: LogprobsMode = "raw_logprobs",
    ) -> list[TokenLogprob]:
        """Teacher-force ``forced_ids`` after the prompt; return each token's real logprob.

        In ``processed_logprobs`` mode the logits are first processed with ``params`` (a forced
        token outside the top-k/top-p support is reported as -9999.0, like vLLM's ``-inf``).
        """
        if not forced_ids:
            return []
        full = [*prompt_ids, *forced_ids]
        with self._active(adapter) as model, torch.inference_mode():
            input_1T = torch.tensor([full[:-1]], device=self.device)
            out = self._forward(model, input_1T, keep=len(forced_ids), use_cache=False)
            logits_TV = out.logits[0, -len(forced_ids) :].float()
            if logprobs_mode == "processed_logprobs" and params is not None:
                logits_TV = _process(logits_TV, params)
            logprobs_TV = torch.log_softmax(logits_TV, dim=-1)
        return [
            self._entry(token, logprobs_TV[pos], top_logprobs)
            for pos, token in enumerate(forced_ids)
        ]

    # ----------------------------------------------------------------- LoRA adapters

    @property
    def adapters(self) -> dict[str, str]:
        """Loaded adapters: name -> the path they were loaded from."""
        return dict(self._adapter_paths)

    @contextlib.contextmanager
    def _active(self, adapter: str | None) -> Iterator[Any]:
        if adapter is not None and adapter not in self._adapter_paths:
            raise NotFoundError(f"The model `{adapter}` does not exist.", param="model")
        if self._peft is None:
            yield self.model
        elif adapter is None:
            with self._peft.disable_adapter():
                yield self._peft
        else:
            self._peft.set_adapter(adapter)
            yield self._peft

    def load_adapter(self, name: str, path: str, *, replace: bool = False) -> None:
        """Load a PEFT LoRA adapter directory under ``name`` (``replace`` reloads in place)."""
        require_serve_deps(extra=("peft",))
        from peft import PeftConfig, PeftModel

        if name in self._adapter_paths and not replace:
            raise BadRequestError(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                param="lora_name",
                err_type="InvalidUserInput",
            )
        directory = Path(path)
        if not (directory / "adapter_config.json").is_file():
            raise NotFoundError(f"No adapter found for {path}", param="lora_path")
        try:
            PeftConfig.from_pretrained(str(directory))
        except Exception as error:  # any parse failure is the caller's bad input
            raise BadRequestError(f"Invalid LoRA adapter at {path}: {error}") from error
        if name in self._adapter_paths:
            self._drop_adapter(name)
        try:
            with warnings.catch_warnings():
                # peft 0.21 calls a transformers API deprecated in 5.x; not actionable here.
                warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(
                        self.model, str(directory), adapter_name=name, is_trainable=False
                    ).eval()
                else:
                    self._peft.load_adapter(str(directory), adapter_name=name, is_trainable=False)
        except Exception as error:  # PEFT raises many types for bad weights
            raise BadRequestError(f"Failed to load LoRA adapter '{name}': {error}") from error
        self._adapter_paths[name] = str(path)
        logger.info("loaded LoRA adapter %r from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        """Remove the adapter ``name``; the base model is untouched."""
        if name not in self._adapter_paths:
            raise NotFoundError(f"The lora adapter '{name}' cannot be found.", param="lora_name")
        self._drop_adapter(name)
        logger.info("unloaded LoRA adapter %r", name)

    def _drop_adapter(self, name: str) -> None:
        remaining = [other for other in self._adapter_paths if other != name]
        if not remaining:
            # PEFT cannot run with zero adapters: strip the LoRA layers, keep the base weights.
            self.model = self._peft.unload().eval()
            self._peft = None
        else:
            self._peft.set_adapter(remaining[0])  # deleting the active adapter would warn
            self._peft.delete_adapter(name)
        del self._adapter_paths[name]


def _process(logits_NV: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return process_logits(
        logits_NV, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )


def _pick(processed_V: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Choose the next token: greedy at temperature 0, else a draw from the processed logits."""
    if is_greedy(params.temperature):
        return int(torch.argmax(processed_V))
    probs_V = torch.softmax(processed_V, dim=-1)
    return int(torch.multinomial(probs_V, 1, generator=generator))


def _finite(logprob: float) -> float:
    """A logprob JSON can carry: ``-inf`` (outside the sampling support) becomes -9999.0."""
    return logprob if logprob > MASKED_LOGPROB else MASKED_LOGPROB
