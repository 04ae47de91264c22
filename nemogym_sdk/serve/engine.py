"""Request handling behind the HTTP routes: model routing, the two generation modes, LoRA.

`ServeEngine` turns a parsed JSON body into the JSON answer. Its methods are synchronous and
touch the model; the HTTP layer calls them on worker threads: in ``sample`` mode many at once
(the backend decodes concurrent generations as one batch), in ``scripted`` mode one at a time.

Modes:

* ``sample``: real sampling from the model (temperature, top_p, top_k, seed, stop, max_tokens).
* ``scripted``: deterministic multi-turn behaviour for any NeMo Gym environment. For the first
  ``scripted_tool_turns`` assistant turns of a conversation (counted from the assistant messages
  already in the request) it calls one of the offered tools, rotating through them, with arguments
  that satisfy the tool's JSON schema; afterwards (or with no tools) it answers in text: one
  fixed text, or what a `~nemogym_sdk.serve.script.Script` picks for the conversation. The text
  is forced, but every token is scored by the model, so the logprobs are genuine.

Logprobs follow ``logprobs_mode`` like vLLM's ``--logprobs-mode``: ``raw_logprobs`` (default) or
``processed_logprobs`` (after temperature, top-k and top-p; see `nemogym_sdk.logits`).

Backends: `CausalLMBackend` (transformers, in process; both modes; `chat`, called on the HTTP
layer's worker threads) or `VllmBackend` (a vLLM server; ``sample`` mode only; `chat_async`,
concurrent). Prompts are rendered and spliced here with the backend's tokenizer either way.

An episode the client gave up on (``episodes``, `nemogym_sdk.serve.episodes`) has its turn in
flight stopped (the CPU batch drops it at the next token; the request to vLLM is closed, so
vLLM aborts it) and its later turns refused with HTTP 409.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.chat import HISTORIES, History, count_assistant_turns
from nemogym_sdk.serve.episodes import Episodes, turn_seed
from nemogym_sdk.serve.errors import BadRequestError, NotFoundError, ServeError
from nemogym_sdk.serve.interface import LOGPROBS_MODES, Generation, LogprobsMode, ModelBackend
from nemogym_sdk.serve.parsers import OutputParsers
from nemogym_sdk.serve.protocol import (
    ChatRequest,
    FinishReason,
    RequestSampling,
    TokenizeRequest,
    chat_completion_body,
    completion_body,
    model_card,
)
from nemogym_sdk.serve.record import SamplingRecorder
from nemogym_sdk.serve.script import DEFAULT_SCRIPTED_ANSWER, Script
from nemogym_sdk.serve.tools import example_arguments, format_tool_call, tool_function
from nemogym_sdk.serve.versions import ServedVersion, ServedVersions, version_cards
from nemogym_sdk.serve.vllm_backend import VllmBackend
from nemogym_sdk.wire import (
    CARD_MAX_NUM_SEQS_FIELD,
    LOAD_VERSION_FIELD,
    ROUTED_EXPERTS,
    affinity_key,
    episode_of,
    policy_version_envelope,
)

if TYPE_CHECKING:
    from nemogym_sdk.serve.backend import CausalLMBackend

__all__ = ["DEFAULT_SCRIPTED_ANSWER", "Mode", "ServeEngine"]

logger = logging.getLogger(__name__)

Mode = Literal["scripted", "sample"]


class ServeEngine:
    """Serve one backend under a model name, plus its LoRA adapters by their names."""

    def __init__(
        self,
        backend: CausalLMBackend | VllmBackend,
        *,
        served_model_name: str | None = None,
        mode: Mode = "scripted",
        scripted_tool_turns: int = 2,
        scripted_answer: str | Script = DEFAULT_SCRIPTED_ANSWER,
        seed: int = 0,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        recorder: SamplingRecorder | None = None,
        versions: ServedVersions | None = None,
        parsers: OutputParsers | None = None,
        history: History = "contiguous",
    ) -> None:
        """Configure the engine; ``seed`` seeds the draws for requests that send no ``seed``.

        ``scripted_answer`` is scripted mode's text answer: one text, or a `Script` that
        chooses it by what the conversation says (see `nemogym_sdk.serve.script`).

        ``recorder`` writes one JSON line per generation: the sampling parameters it used.

        ``versions`` holds the adapters' versions and says which answers a request
        (`nemogym_sdk.serve.versions`; default: one version per name, reloaded in place).

        ``parsers`` reads reasoning and tool calls out of a generated turn as vLLM's
        ``--reasoning-parser`` and ``--tool-call-parser`` do (default: hermes tool calls, no
        reasoning parser); scripted mode writes hermes tool calls, so it takes no other.

        ``history`` is how a prompt holds the conversation (`nemogym_sdk.serve.chat`):
        ``contiguous`` splices the model's own tokens, ``template`` renders afresh.
        """
        if mode not in ("scripted", "sample"):
            raise ConfigError(f"mode must be 'scripted' or 'sample', got {mode!r}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(
                f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}"
            )
        self.parsers = parsers or OutputParsers()
        if mode == "scripted" and self.parsers.tool_calls not in (None, "hermes"):
            raise ConfigError(
                "scripted mode writes hermes tool calls: serve it with --tool-call-parser hermes"
                f" (got {self.parsers.tool_calls!r}), or sample with --mode sample"
            )
        if history not in HISTORIES:
            raise ConfigError(f"history must be one of {', '.join(HISTORIES)}, got {history!r}")
        self.history: History = history
        if scripted_tool_turns < 0:
            raise ConfigError(f"scripted_tool_turns must be >= 0, got {scripted_tool_turns}")
        self.proxy: VllmBackend | None = backend if isinstance(backend, VllmBackend) else None
        """The vLLM backend, or ``None`` for the transformers one."""
        if self.proxy is not None and mode != "sample":
            raise ConfigError("the vLLM backend serves mode='sample' only (scripted needs torch)")
        self.backend: ModelBackend = backend
        self._local = None if isinstance(backend, VllmBackend) else backend
        self.recorder = recorder
        self.served_model_name: str = served_model_name or (
            backend.vllm_model_name if isinstance(backend, VllmBackend) else backend.name_or_path
        )
        """The base model's name; with vLLM and none given, vLLM's own (known once started)."""
        self.mode: Mode = mode
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.scripted_tool_turns = scripted_tool_turns
        self.script = (
            scripted_answer
            if isinstance(scripted_answer, Script)
            else Script(default=scripted_answer)
        )
        self._rng = random.Random(seed)
        self.versions = versions or ServedVersions()
        self.episodes = Episodes()
        """Episodes the client gave up on (``POST /abort_episode``), and what runs for each."""

    # ----------------------------------------------------------------- models

    def resolve_model(self, model: str | None) -> str | None:
        """Return the adapter to use for ``model`` (``None`` = base); 404 if unknown."""
        if model is None or model == self.served_model_name:
            return None
        if model in self.local.adapters:
            return model
        raise NotFoundError(f"The model `{model}` does not exist.", param="model")

    def resolve_version(self, request: ChatRequest) -> ServedVersion | None:
        """The adapter version that answers ``request`` (None: the name is not versioned)."""
        return self.versions.resolve(request.model, request.messages)

    def list_models(self) -> dict[str, Any]:
        """Return the ``GET /v1/models`` body: the base model (with how many generations it
        decodes at once), then each adapter."""
        root, length = self.backend.name_or_path, self.backend.max_model_len
        cards = [model_card(self.served_model_name, root=root, parent=None, max_model_len=length)]
        cards[0][CARD_MAX_NUM_SEQS_FIELD] = self.local.max_batch
        for name, path in self.local.adapters.items():
            cards.append(
                model_card(name, root=path, parent=self.served_model_name, max_model_len=None)
            )
        return {"object": "list", "data": version_cards(cards, self.versions, self.adapter_card)}

    def adapter_card(self, name: str, root: str) -> dict[str, Any]:
        """A ``/v1/models`` card for adapter ``name`` loaded from ``root``."""
        return model_card(name, root=root, parent=self.served_model_name, max_model_len=None)

    # ----------------------------------------------------------------- chat

    @property
    def local(self) -> CausalLMBackend:
        """The transformers backend; `ServeError` (501) when this engine proxies vLLM."""
        if self._local is None:
            raise _NotLocalError("This route is answered by the vLLM server, not the engine.")
        return self._local

    def _prompt(self, request: ChatRequest | TokenizeRequest) -> list[int]:
        """The prompt of ``request``'s messages: spliced onto the model's tokens, or the
        template's rendering (``history``)."""
        build = self.backend.prompt_ids if self.history == "contiguous" else self.backend.render
        return build(
            request.messages or (),
            tools=request.tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    def _seed(self, request: ChatRequest, episode: str | None, prompt_length: int) -> int:
        """The turn's seed (`turn_seed`), or one of the server's own draws."""
        seed = turn_seed(request.sampling.seed, episode, prompt_length)
        return self._rng.getrandbits(63) if seed is None else seed

    def _chat_request(self, body: Any) -> ChatRequest:
        """The validated request; a ``tool_choice`` the output parsers cannot honour is a
        400, with vLLM's words."""
        request = ChatRequest.from_json(body)
        refusal = self.parsers.refusal(request.tool_choice)
        if refusal is not None:
            raise BadRequestError(refusal, param="tool_choice")
        return request

    def chat(self, body: Any) -> dict[str, Any]:
        """Answer a ``POST /v1/chat/completions`` body (transformers backend); a turn of an
        abandoned episode is refused, and one generating when it is abandoned stops."""
        request = self._chat_request(body)
        served = self.resolve_version(request)
        adapter = served.slot if served is not None else self.resolve_model(request.model)
        prompt_ids = self._prompt(request)
        episode = episode_of(body)
        seed: int | None = None
        if self.mode == "sample":
            seed = self._seed(request, episode, len(prompt_ids))
            with self.episodes.running(episode) as aborted:
                generation = self.local.sample(
                    prompt_ids,
                    request.sampling,
                    seed=seed,
                    adapter=adapter,
                    top_logprobs=request.top_logprobs,
                    logprobs_mode=self.logprobs_mode,
                    aborted=aborted,
                )
            if generation.finish_reason == "abort":
                raise self.episodes.stopped(episode)
        else:
            self.episodes.check(episode)
            generation = self._scripted(request, prompt_ids, adapter)
        return self._answer(
            request, prompt_ids, generation, seed, adapter or self.served_model_name, served
        )

    async def chat_async(self, body: Any) -> dict[str, Any]:
        """Answer a ``POST /v1/chat/completions`` body by generating on the vLLM server.

        The prompt is rendered and spliced here; vLLM gets its token ids, so what it generates
        from is exactly the history NeMo Gym carries.
        """
        proxy = self.proxy
        if proxy is None:
            raise _NotLocalError("chat_async needs the vLLM backend; call chat().")
        request = self._chat_request(body)
        served = self.resolve_version(request)
        model = served.slot if served else proxy.vllm_model(request.model, self.served_model_name)
        prompt_ids = self._prompt(request)
        # Only a seed the request sent: a per-request seed makes vLLM 0.32 on CPU crash
        # ("CPU Generator does not use offset") when chunked prefill splits a prompt across
        # steps, which a batch of concurrent rollouts does. Unseeded requests use vLLM's
        # engine-wide generator (seeded by its --seed).
        episode = episode_of(body)
        seed = turn_seed(request.sampling.seed, episode, len(prompt_ids))
        generating = functools.partial(
            proxy.generate,
            prompt_ids,
            request.sampling,
            model=model,
            seed=seed,
            top_logprobs=request.top_logprobs,
            affinity=affinity_key(body),
        )
        generation = await self.episodes.generate(episode, generating)
        return self._answer(request, prompt_ids, generation, seed, model, served)

    def complete(self, body: Any) -> dict[str, Any]:
        """Answer a ``POST /v1/completions`` body whose ``prompt`` is token ids (or text):
        the part of vLLM's API a proxy in front generates with, so this server can be a
        sampler replica behind ``vllm-router`` (transformers backend, ``sample`` mode).

        ``model`` names the base model or a loaded adapter (a version slot such as
        ``policy@v3`` is an adapter like any other); ``logprobs: k`` reports the sampled
        token's logprob and the ``k`` best alternatives.
        """
        if self.mode != "sample":
            raise BadRequestError("/v1/completions samples: start the server with --mode sample.")
        if not isinstance(body, dict):
            raise BadRequestError("The request body must be a JSON object.")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.local.encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            prompt_ids = list(prompt)
        else:
            raise BadRequestError(
                "'prompt' must be a string or a non-empty list of token ids.", param="prompt"
            )
        sampling = RequestSampling.from_json(body)
        top = body.get("logprobs")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
            raise BadRequestError("'logprobs' must be an integer >= 0.", param="logprobs")
        model = body.get("model")
        adapter = self.resolve_model(model if isinstance(model, str) else None)
        seed = sampling.seed if sampling.seed is not None else self._rng.getrandbits(63)
        generation = self.local.sample(
            prompt_ids,
            sampling,
            seed=seed,
            adapter=adapter,
            top_logprobs=int(top or 0),
            logprobs_mode=self.logprobs_mode,
        )
        text = self.backend.decode(generation.token_ids)
        if generation.text_end is not None:
            text = text[: generation.text_end]
        answer = completion_body(
            model=model if isinstance(model, str) else self.served_model_name,
            text=text,
            finish_reason=_finish(generation.finish_reason),
            stop_reason=generation.stop_reason,
            prompt_token_ids=prompt_ids,
            token_ids=generation.token_ids,
            logprobs=generation.tokens if top is not None else None,
            return_token_ids=bool(body.get("return_token_ids", False)),
            return_tokens_as_token_ids=bool(body.get("return_tokens_as_token_ids", False)),
        )
        if self.recorder is not None:
            self.recorder.record(
                completion_id=answer["id"],
                model=answer["model"],
                sampled_model=adapter or self.served_model_name,
                backend="transformers",
                mode=self.mode,
                logprobs_mode=self.logprobs_mode,
                params=sampling,
                seed=seed,
                prompt_ids=prompt_ids,
                generation_ids=generation.token_ids,
                finish_reason=answer["choices"][0]["finish_reason"],
            )
        return answer

    def _answer(
        self,
        request: ChatRequest,
        prompt_ids: Sequence[int],
        generation: Generation,
        seed: int | None,
        sampled_model: str,
        served: ServedVersion | None = None,
    ) -> dict[str, Any]:
        text = self.backend.decode(generation.token_ids)
        if generation.text_end is not None:
            text = text[: generation.text_end]
        finish: FinishReason = _finish(generation.finish_reason)
        turn = self.parsers.turn(
            text,
            finish_reason=finish,
            tools=request.tools,
            tool_choice=request.tool_choice,
            chat_template_kwargs=request.chat_template_kwargs,
            include_reasoning=request.include_reasoning,
            parallel_tool_calls=request.parallel_tool_calls,
        )
        if turn.finish_reason == "tool_calls":
            finish = "tool_calls"
        answer = chat_completion_body(
            model=request.model or self.served_model_name,
            content=turn.content,
            tool_calls=turn.tool_calls,
            reasoning=turn.reasoning,
            finish_reason=finish,
            stop_reason=generation.stop_reason,
            prompt_token_ids=prompt_ids,
            token_ids=generation.token_ids,
            logprobs=generation.tokens if request.logprobs else None,
            return_token_ids=request.return_token_ids,
            return_tokens_as_token_ids=request.return_tokens_as_token_ids,
        )
        if served is not None:  # the version that really answered, for the rollout to keep
            answer["choices"][0]["message"][ROUTED_EXPERTS] = policy_version_envelope(
                served.version
            )
        if self.recorder is not None:
            self.recorder.record(
                completion_id=answer["id"],
                model=answer["model"],
                sampled_model=sampled_model,
                backend="vllm" if self.proxy is not None else "transformers",
                mode=self.mode,
                logprobs_mode=self.logprobs_mode,
                params=request.sampling,
                seed=seed,
                prompt_ids=prompt_ids,
                generation_ids=generation.token_ids,
                finish_reason=finish,
                version=None if served is None else served.version,
            )
        return answer

    def scripted_text(self, request: ChatRequest) -> str:
        """Return the text the scripted policy emits for this request (without EOS)."""
        tool = self._scripted_tool(request)
        if tool is None:
            return self.script.answer(request.messages)
        name, parameters = tool
        return format_tool_call(name, example_arguments(parameters))

    def _scripted_tool(self, request: ChatRequest) -> tuple[str, Mapping[str, Any]] | None:
        functions = [f for f in (tool_function(t) for t in request.tools or []) if f is not None]
        choice = request.tool_choice
        if not functions or choice == "none":
            return None
        turn = count_assistant_turns(request.messages)
        if isinstance(choice, Mapping):
            wanted = (choice.get("function") or {}).get("name")
            named = [f for f in functions if f[0] == wanted]
            if not named:
                raise BadRequestError(f"tool_choice names an unknown function: {wanted!r}.")
            return named[0]
        if choice == "required" or turn < self.scripted_tool_turns:
            return functions[turn % len(functions)]
        return None

    def _scripted(
        self, request: ChatRequest, prompt_ids: Sequence[int], adapter: str | None
    ) -> Generation:
        forced = [*self.local.encode(self.scripted_text(request)), self.local.eos_token_id]
        budget = self.local.check_prompt(prompt_ids, request.sampling.max_tokens)
        finish = "stop"
        if len(forced) > budget:
            forced, finish = forced[:budget], "length"
        scored = self.local.score(
            prompt_ids,
            forced,
            adapter=adapter,
            top_logprobs=request.top_logprobs,
            params=request.sampling,
            logprobs_mode=self.logprobs_mode,
        )
        return Generation(tokens=tuple(scored), finish_reason=finish)

    # ----------------------------------------------------------------- tokenize

    def tokenize(self, body: Any) -> dict[str, Any]:
        """Answer a ``POST /tokenize`` body (chat messages get the prompt generation gets)."""
        request = TokenizeRequest.from_json(body)
        versioned = self.versions.resolve(request.model, ())
        if request.model is not None and self.proxy is None and versioned is None:
            self.resolve_model(request.model)  # 404 for a name that is not served
        if request.messages is not None:
            ids = self._prompt(request)
        else:
            ids = self.backend.encode(
                request.prompt or "", add_special_tokens=request.add_special_tokens
            )
        strs = None
        if request.return_token_strs:
            strs = [str(s) for s in self.backend.tokenizer.convert_ids_to_tokens(ids)]
        return {
            "count": len(ids),
            "max_model_len": self.backend.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    # ----------------------------------------------------------------- LoRA

    def load_lora(self, body: Any) -> str:
        """Answer ``POST /v1/load_lora_adapter``; return vLLM's success text."""
        if not isinstance(body, dict):
            raise BadRequestError("The request body must be a JSON object.")
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise BadRequestError(
                "Both 'lora_name' and 'lora_path' must be provided.", err_type="InvalidUserInput"
            )
        if name == self.served_model_name:
            raise BadRequestError(
                f"The lora adapter name '{name}' conflicts with a served base model.",
                param="lora_name",
                err_type="InvalidUserInput",
            )
        inplace = bool(body.get("load_inplace", False))
        version = load_version(body)
        if version is None:
            for slot in self.versions.forget(name):  # a plain load ends the versioned name
                if slot != name:
                    self.local.unload_adapter(slot)
            self.local.load_adapter(name, path, replace=inplace)
        else:
            loading = self.versions.plan(name, version)
            replace = loading.replace or (inplace and loading.slot in self.local.adapters)
            try:
                self.local.load_adapter(loading.slot, path, replace=replace)
            except ServeError:
                self.versions.retain(set(self.local.adapters))  # an in-place load may lose it
                raise
            for slot in loading.evict:
                self.local.unload_adapter(slot)
            self.versions.commit(name, version, path, loading)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_lora(self, body: Any) -> str:
        """Answer ``POST /v1/unload_lora_adapter``; return vLLM's success text."""
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequestError(
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                err_type="InvalidUserInput",
            )
        slots = self.versions.forget(name)
        for slot in slots or (name,):
            self.local.unload_adapter(slot)
        return f"Success: LoRA adapter '{name}' removed successfully."


class _NotLocalError(ServeError, NotImplementedError):
    status = 501
    err_type = "NotImplementedError"


def _finish(reason: str) -> FinishReason:
    return "length" if reason == "length" else "stop"


def load_version(body: Mapping[str, Any]) -> int | None:
    """The policy version a load request names (``LoraSync`` sends it), or None."""
    version = body.get(LOAD_VERSION_FIELD)
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadRequestError(
            f"'{LOAD_VERSION_FIELD}' must be an integer >= 0, got {version!r}.",
            param=LOAD_VERSION_FIELD,
            err_type="InvalidUserInput",
        )
    return version
