"""Transformers causal-LM backend: render prompts, sample with logprobs, score forced tokens, LoRA.

Thread-safe: the HTTP layer answers each request on its own thread. Generations asked for at
once are decoded together, one forward pass per token for the whole batch
(`nemogym_sdk.serve.batch`); scoring and adapter changes take the model alone.
Logprobs follow vLLM's ``--logprobs-mode`` (see `nemogym_sdk.logits`): ``raw_logprobs``
(the default) is the model's log-softmax whatever the sampling parameters; ``processed_logprobs``
is the log-softmax of the distribution the token was drawn from (temperature, top-k, top-p
applied), which is what a learner's importance ratio must be compared with.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemogym_sdk.devices import torch_device
from nemogym_sdk.serve._deps import require_serve_deps

require_serve_deps()

import torch  # noqa: E402

from nemogym_sdk.logits import process_logits  # noqa: E402
from nemogym_sdk.serve.batch import Batcher, Finish, SampleJob, decode_batch  # noqa: E402
from nemogym_sdk.serve.errors import BadRequestError  # noqa: E402
from nemogym_sdk.serve.interface import Generation, LogprobsMode, finite_logprob  # noqa: E402
from nemogym_sdk.serve.lora_adapters import LoraAdapters  # noqa: E402
from nemogym_sdk.serve.protocol import RequestSampling, TokenLogprob  # noqa: E402
from nemogym_sdk.serve.template import ChatTemplate, eos_ids_of  # noqa: E402

__all__ = ["DEFAULT_MAX_BATCH", "CausalLMBackend", "Generation"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 64
"""Most generations decoded in one batch (vLLM's ``--max-num-seqs``)."""


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
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        """Wrap a loaded ``transformers`` model (eval mode, moved to ``device``) and fast
        tokenizer; ``device`` is a torch device or a device setting
        (`nemogym_sdk.devices.torch_device`); ``max_batch`` generations at most are decoded
        together."""
        generation_config = getattr(model, "generation_config", None)
        self.template = ChatTemplate(
            tokenizer,
            eos_token_ids=eos_ids_of(tokenizer, getattr(generation_config, "eos_token_id", None)),
            name=name_or_path,
        )
        """The tokenizer and chat template: rendering, tokenizing, the prefix splice."""
        self.device: torch.device = (
            device if isinstance(device, torch.device) else torch_device(device)
        )
        """Where the model runs; prompts, sampling and LoRA adapters live there too."""
        self.lora = LoraAdapters(model.to(self.device).eval())
        """The named LoRA adapters served on top of the base model."""
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
        forward_params = inspect.signature(type(model).forward).parameters
        # transformers renamed past_key_values -> cache (5.2x); older releases lack logits_to_keep.
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in forward_params
        self._model_lock = threading.Lock()
        """Held by a decoding batch, a scoring call or an adapter change: one at a time."""
        self._batcher = Batcher(self._decode, max_batch)
        self.generated_tokens = 0
        """Tokens sampled since the server started (``GET /metrics``; one batch at a time
        adds to it)."""

    @property
    def max_batch(self) -> int:
        """Most generations decoded together."""
        return self._batcher.max_batch

    @classmethod
    def tiny(
        cls,
        seed: int = 0,
        *,
        device: str | torch.device = "cpu",
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> CausalLMBackend:
        """Return the in-process tiny model (see `nemogym_sdk.serve.tiny`)."""
        from nemogym_sdk.serve.tiny import TINY_MODEL_NAME, build_tiny_model, build_tiny_tokenizer

        return cls(
            build_tiny_model(seed),
            build_tiny_tokenizer(),
            name_or_path=TINY_MODEL_NAME,
            device=device,
            max_batch=max_batch,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_model_len: int | None = None,
        device: str | torch.device = "cpu",
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> CausalLMBackend:
        """Load a local model directory (weights + tokenizer with a chat template) in fp32 on
        ``device`` (default the CPU)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"Model directory not found: {directory}")
        target = device if isinstance(device, torch.device) else torch_device(device)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        return cls(
            model,
            tokenizer,
            name_or_path=str(directory),
            max_model_len=max_model_len,
            device=target,
            max_batch=max_batch,
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

    def entry(
        self, token_id: int, logprobs_V: torch.Tensor, top_k: int, logprob: float | None = None
    ) -> TokenLogprob:
        """One position's report: the token, its logprob (``logprob`` when the caller has it
        already, else read from ``logprobs_V``) and the ``top_k`` most likely alternatives."""
        top: tuple[tuple[int, float, str], ...] = ()
        if top_k > 0:
            values, indices = torch.topk(logprobs_V, k=min(top_k, logprobs_V.shape[-1]))
            top = tuple(
                (int(i), float(v), self.token_text(int(i)))
                for v, i in zip(values.tolist(), indices.tolist(), strict=True)
            )
        return TokenLogprob(
            token_id=token_id,
            logprob=finite_logprob(float(logprobs_V[token_id]) if logprob is None else logprob),
            text=self.token_text(token_id),
            top=tuple((i, finite_logprob(v), text) for i, v, text in top),
        )

    def forward(
        self,
        model: Any,
        input_ids_BT: torch.Tensor,
        keep: int,
        cache: Any = None,
        *,
        use_cache: bool = True,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> Any:
        """One forward pass keeping the last ``keep`` positions' logits; ``mask`` and
        ``positions`` (attention mask and position ids) for a left-padded batch."""
        kwargs: dict[str, Any] = {"input_ids": input_ids_BT, "use_cache": use_cache}
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        if mask is not None and not bool(mask.all()):  # no mask: the unpadded computation
            kwargs["attention_mask"] = mask
        if positions is not None:
            kwargs["position_ids"] = positions
        return model(**kwargs)

    @staticmethod
    def cache_of(out: Any) -> Any:
        """The KV cache a forward pass returned."""
        cache = getattr(out, "cache", None)  # transformers >= 5.2x
        return cache if cache is not None else getattr(out, "past_key_values", None)

    def sample(
        self,
        prompt_ids: Sequence[int],
        params: RequestSampling,
        *,
        seed: int,
        adapter: str | None = None,
        top_logprobs: int = 0,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        aborted: threading.Event | None = None,
    ) -> Generation:
        """Generate until EOS, a stop string/token, or ``params.max_tokens`` (KV-cached).

        Each token's logprob follows ``logprobs_mode`` (raw, or of the processed distribution).
        Calls from several threads at once are decoded together. ``aborted`` set (the client
        gave up on the episode) ends the generation at its next token, ``finish_reason``
        ``"abort"`` (vLLM's name).
        """
        budget = self.check_prompt(prompt_ids, params.max_tokens)
        if budget == 0:
            return Generation(tokens=(), finish_reason="length")
        job = SampleJob(
            prompt_ids=tuple(prompt_ids),
            params=params,
            seed=seed,
            adapter=adapter,
            top_logprobs=top_logprobs,
            logprobs_mode=logprobs_mode,
            budget=budget,
            aborted=aborted,
        )
        return self._batcher.run(job)

    def _decode(self, jobs: list[SampleJob], finish: Finish) -> None:
        with self._model_lock, self._active(jobs[0].adapter) as model, torch.inference_mode():
            decode_batch(self, model, jobs, finish)

    def score(
        self,
        prompt_ids: Sequence[int],
        forced_ids: Sequence[int],
        *,
        adapter: str | None = None,
        top_logprobs: int = 0,
        params: RequestSampling | None = None,
        logprobs_mode: LogprobsMode = "raw_logprobs",
    ) -> list[TokenLogprob]:
        """Teacher-force ``forced_ids`` after the prompt; return each token's real logprob.

        In ``processed_logprobs`` mode the logits are first processed with ``params`` (a forced
        token outside the top-k/top-p support is reported as -9999.0, like vLLM's ``-inf``).
        """
        if not forced_ids:
            return []
        full = [*prompt_ids, *forced_ids]
        with self._model_lock, self._active(adapter) as model, torch.inference_mode():
            input_1T = torch.tensor([full[:-1]], device=self.device)
            out = self.forward(model, input_1T, keep=len(forced_ids), use_cache=False)
            logits_TV = out.logits[0, -len(forced_ids) :].float()
            if logprobs_mode == "processed_logprobs" and params is not None:
                logits_TV = _process(logits_TV, params)
            logprobs_TV = torch.log_softmax(logits_TV, dim=-1)
        return [
            self.entry(token, logprobs_TV[pos], top_logprobs)
            for pos, token in enumerate(forced_ids)
        ]

    # ----------------------------------------------------------------- LoRA adapters

    @property
    def model(self) -> Any:
        """The base model (with LoRA layers while an adapter is loaded)."""
        return self.lora.module

    @property
    def adapters(self) -> dict[str, str]:
        """Loaded adapters: name -> the path they were loaded from."""
        return self.lora.paths

    def _active(self, adapter: str | None) -> contextlib.AbstractContextManager[Any]:
        return self.lora.active(adapter)

    def load_adapter(self, name: str, path: str, *, replace: bool = False) -> None:
        """Load a PEFT LoRA adapter directory under ``name`` (``replace`` reloads in place)."""
        with self._model_lock:
            self.lora.load(name, path, replace=replace)

    def unload_adapter(self, name: str) -> None:
        """Remove the adapter ``name``; the base model is untouched."""
        with self._model_lock:
            self.lora.unload(name)


def _process(logits_NV: torch.Tensor, params: RequestSampling) -> torch.Tensor:
    return process_logits(
        logits_NV, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )
