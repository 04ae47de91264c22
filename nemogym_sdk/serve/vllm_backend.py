"""A token-in/token-out backend that forwards generation to a vLLM server (GPU or CPU).

Stock vLLM renders and tokenizes the chat history itself on every turn, so the prompt of turn
``n + 1`` holds a re-tokenization of what the model generated in turn ``n``, not the tokens it
sampled (NeMo Gym leaves this fix to the model server). `VllmBackend` keeps the prompt side local:
`ServeEngine` renders and splices the prompt ids with the model directory's own tokenizer
(`nemogym_sdk.serve.template.ChatTemplate`), and only the generation goes to vLLM, as a
``POST /v1/completions`` whose ``prompt`` is that token-id list. Per generated token it takes
``choices[0].token_ids[i]`` and ``logprobs.token_logprobs[i]`` (checked against
``logprobs.tokens[i] == "token_id:<id>"``, so the logprob is the sampled token's, never an
alternative's), and checks that vLLM echoes the prompt ids it was sent.

The model name is forwarded: the proxy's base name maps to vLLM's served base name, and any
other name (a LoRA adapter) is sent as is, so vLLM routes it to the adapter.

**Replicas.** ``vllm_url`` may be ``vllm-router`` in front of several samplers
(``replicas``: vLLM servers, or ``nemogym_sdk.serve`` workers that speak the same
``/v1/completions``). Each generation then carries the request's affinity key as the
router's ``x-session-id`` header, so a group stays on one replica, and adapters are loaded
on every replica directly (the router would forward a load to one of them only).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import orjson
import requests

from nemogym_sdk._net.ready import answered, poll_ready
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.hosts import openai_url, server_root
from nemogym_sdk.serve.errors import (
    BadGatewayError,
    BadRequestError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from nemogym_sdk.serve.interface import Generation, LogprobsMode
from nemogym_sdk.serve.protocol import RequestSampling
from nemogym_sdk.serve.template import ChatTemplate
from nemogym_sdk.serve.vllm_completions import (
    completion_request,
    error_message,
    parse_completion,
    token_id_of,
)
from nemogym_sdk.wire import ROUTER_FINISH_SESSION, ROUTER_SESSION_HEADER, SESSION_ID

__all__ = ["VllmBackend", "completion_request", "parse_completion"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_PROBE_TEXT = "Hello! How are you today?"
_SAME_LOGPROB = 1e-3


class VllmBackend:
    """Generation on a vLLM server; prompts, tokenization and decoding stay local.

    Call `start` on the event loop that serves requests (the app does, on startup) and
    `close` when done.
    """

    def __init__(
        self,
        template: ChatTemplate,
        vllm_url: str,
        *,
        name_or_path: str,
        vllm_model_name: str | None = None,
        max_model_len: int | None = None,
        timeout: float = 600.0,
        connect_wait: float = 60.0,
        api_key: str | None = None,
        replicas: Sequence[str] = (),
        replica_timeout: float = 15.0,
    ) -> None:
        """Point at ``vllm_url`` (``http://host:port/v1``); the model names are read at start.

        Args:
            template: the tokenizer and chat template of the model vLLM serves.
            vllm_url: vLLM's OpenAI base URL, with ``/v1``.
            name_or_path: the local model directory (for ``/v1/models`` cards and messages).
            vllm_model_name: vLLM's served base model name; default: read from its
                ``/v1/models`` (the card without a parent).
            max_model_len: context window; default: read from vLLM's ``/v1/models``.
            timeout: seconds one generation may take.
            connect_wait: seconds `start` waits for vLLM to answer ``/v1/models``.
            api_key: sent as ``Authorization: Bearer`` if vLLM was started with ``--api-key``.
            replicas: when ``vllm_url`` is a router, the samplers behind it: adapters are
                loaded on each of them.
            replica_timeout: seconds a replica gets to answer an adapter load, unload or
                listing; one that does not (frozen, or a node that stopped) is taken out of
                the router and the publish set, and comes back once it answers and has loaded
                the versions served (`nemogym_sdk.serve.proxy_routes`).
        """
        self.root_url = server_root(vllm_url)
        self.replicas: tuple[str, ...] = tuple(server_root(url) for url in replicas)
        """The samplers behind a router (server roots); empty when ``vllm_url`` is one."""
        if not replica_timeout > 0:
            raise ConfigError(f"replica_timeout must be > 0 seconds, got {replica_timeout}")
        self.replica_timeout = replica_timeout
        self.dropped: dict[str, str] = {}
        """Replicas taken out of the router (server root -> why), until they come back."""
        self.drops = 0
        """Replicas dropped so far; a generation in flight at a drop is sent again."""
        self._generating: set[asyncio.Future[Any]] = set()
        self.vllm_url = openai_url(vllm_url)
        self.template = template
        self.tokenizer: Any = template.tokenizer
        self.name_or_path = name_or_path
        self.vllm_model_name: str = vllm_model_name or ""
        self.max_model_len: int = max_model_len or 0
        self.timeout = timeout
        self.connect_wait = connect_wait
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._texts: dict[int, str] = {}

    @classmethod
    def from_pretrained(cls, path: str | Path, vllm_url: str, **kwargs: Any) -> VllmBackend:
        """Use the tokenizer of the local model directory that vLLM serves."""
        return cls(ChatTemplate.from_pretrained(path), vllm_url, name_or_path=str(path), **kwargs)

    # ----------------------------------------------------------------- tokenizer side

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Tokenize plain text locally."""
        return self.template.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize locally, skipping special tokens."""
        return self.template.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        """One token spelled out (cached)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.template.token_text(token_id)
        return text

    def prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The spliced prompt, rendered locally (see `nemogym_sdk.serve.chat`)."""
        return self.template.prompt_ids(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The template's own rendering, locally (no splice)."""
        return self.template.render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the HTTP session, wait for vLLM, and read its base model name and context."""
        if self._session is None:
            # vLLM's uvicorn drops idle keep-alive connections after 5 s: retire ours sooner.
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=3.0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=10),
                headers=self._headers,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        await asyncio.to_thread(self._wait_answering)
        status, raw, _ = await self.forward("GET", "/v1/models")
        if status != 200:
            message, err_type, param = error_message(status, raw)
            raise UpstreamError(message, status=status, err_type=err_type, param=param)
        cards = orjson.loads(raw).get("data") or []
        base = [c for c in cards if isinstance(c, dict) and not c.get("parent")]
        if not base:
            raise BadGatewayError(f"vLLM at {self.vllm_url} lists no base model in /v1/models.")
        if not self.vllm_model_name:
            self.vllm_model_name = str(base[0]["id"])
        if not self.max_model_len:
            self.max_model_len = int(base[0].get("max_model_len") or 2048)
        logger.info(
            "vLLM at %s serves %r (max_model_len %d)",
            self.vllm_url,
            self.vllm_model_name,
            self.max_model_len,
        )

    def _wait_answering(self) -> None:
        """Block until vLLM answers ``GET /v1/models`` at all (the SDK's one poller)."""
        url = f"{self.vllm_url}/models"
        with requests.Session() as session:
            session.trust_env = False
            pending = poll_ready(
                {"vLLM": url}, timeout=self.connect_wait, session=session, ready=answered
            )
        if pending:
            raise UpstreamUnavailableError(
                f"The vLLM server at {self.vllm_url} did not answer within "
                f"{self.connect_wait:g} s ({pending['vLLM']})."
            )

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ----------------------------------------------------------------- HTTP

    @property
    def adapter_servers(self) -> tuple[str, ...]:
        """Where adapters are loaded: every replica, or vLLM itself (server roots)."""
        return self.replicas or (self.root_url,)

    async def drop_replica(self, server: str, why: str) -> None:
        """Stop using a replica that cannot be reached: it gets no more adapters, and the
        router (``POST /remove_worker``) sends it no more requests, so it can never answer
        with an adapter version it missed. Raises `UpstreamUnavailableError` when none is
        left."""
        self.replicas = tuple(r for r in self.replicas if r != server)
        self.dropped[server] = why
        try:
            status, raw, _ = await self.forward("POST", f"/remove_worker?url={quote(server)}")
            refused = error_message(status, raw)[0] if status >= 400 else None
        except (UpstreamUnavailableError, UpstreamTimeoutError) as error:
            refused = str(error)
        # out of the router first: what is sent again (`_resent_on_drop`) goes to the others
        self.drops += 1
        held = list(self._generating)
        for request in held:
            request.cancel()
        logger.warning(
            "replica %s is unreachable (%s): removed from the router at %s until it answers "
            "again and has loaded the versions served; %d replica(s) left, %d generation(s) "
            "in flight sent again",
            server,
            why,
            self.root_url,
            len(self.replicas),
            len(held),
        )
        if refused is not None:
            logger.warning("the router did not remove %s: %s", server, refused)
        if not self.replicas:
            raise UpstreamUnavailableError(f"No sampler replica is left ({server}: {why}).")

    async def readmit(self, server: str) -> str | None:
        """Route to a dropped replica again (``POST /add_worker``) once it holds what is
        served; the router's refusal, or None when it is back."""
        try:
            status, raw, _ = await self.forward(
                "POST", f"/add_worker?url={quote(server)}", timeout=self.replica_timeout
            )
        except (UpstreamUnavailableError, UpstreamTimeoutError) as error:
            return str(error)
        if status >= 400:
            return error_message(status, raw)[0]
        self.dropped.pop(server, None)
        self.replicas = (*self.replicas, server)
        return None

    async def finish_session(self, key: str) -> tuple[int, bytes, str]:
        """Have the router forget the group ``key`` (``POST /finish_session``), so its
        table holds the groups in flight only; without a router there is nothing to
        forget. The router's answer (status, body, content type)."""
        if not self.replicas and not self.dropped:
            done = {"status": "ok", SESSION_ID: key, "router": False}
            return 200, orjson.dumps(done), "application/json"
        path = f"{ROUTER_FINISH_SESSION}?{SESSION_ID}={quote(key)}"
        return await self.forward("POST", path, timeout=self.replica_timeout)

    async def models(self) -> tuple[int, bytes, str]:
        """``GET /v1/models`` of vLLM, or of the replica that answers first (asked all at
        once, each within ``replica_timeout``: a frozen one must not hold the listing that
        tells a trainer its sampler is alive)."""
        if not self.replicas:
            return await self.forward("GET", "/v1/models")
        asked = [
            asyncio.ensure_future(
                self.forward("GET", "/v1/models", root=server, timeout=self.replica_timeout)
            )
            for server in self.replicas
        ]
        answer: tuple[int, bytes, str] | None = None
        try:
            for next_answer in asyncio.as_completed(asked):
                try:
                    answer = await next_answer
                except (UpstreamUnavailableError, UpstreamTimeoutError):
                    continue
                if answer[0] < 500:
                    return answer
        finally:
            for request in asked:
                if request.done() and not request.cancelled():
                    request.exception()  # retrieved: a later failure is no stray warning
                else:
                    request.cancel()
        if answer is None:
            raise UpstreamUnavailableError("No sampler replica answers GET /v1/models.")
        return answer

    async def forward(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        root: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes, str]:
        """Send ``method path`` to vLLM's root URL (or ``root``, a replica); return status,
        body and content type, within ``timeout`` seconds (default: a generation's).

        Connection failures raise `UpstreamUnavailableError` (503), timeouts
        `UpstreamTimeoutError` (504); HTTP errors are returned, not raised.
        """
        if self._session is None:
            raise UpstreamUnavailableError("The vLLM backend is not started.")
        sent = dict(headers or {})
        if body is not None:
            sent["Content-Type"] = "application/json"
        headers = sent or None
        target = root or self.root_url
        url = f"{target}{path}"
        where = root or self.vllm_url
        limit = self.timeout if timeout is None else timeout
        options: dict[str, Any] = {"data": body, "headers": headers}
        if timeout is not None:
            options["timeout"] = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        try:
            try:
                async with self._session.request(method, url, **options) as r:
                    return r.status, await r.read(), r.content_type
            except aiohttp.ServerDisconnectedError:
                # a pooled connection closed by vLLM as it was reused; nothing was generated
                async with self._session.request(method, url, **options) as r:
                    return r.status, await r.read(), r.content_type
        except aiohttp.ClientConnectionError as error:
            raise UpstreamUnavailableError(
                f"The vLLM server at {where} is unreachable: {error}"
            ) from error
        except TimeoutError as error:
            raise UpstreamTimeoutError(
                f"The vLLM server at {where} did not answer {path} in {limit:.0f} s."
            ) from error

    async def post_json(
        self, path: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> Any:
        """POST JSON to vLLM and decode the answer; vLLM's HTTP errors become `UpstreamError`."""
        status, raw, _ = await self.forward("POST", path, orjson.dumps(body), headers=headers)
        if status >= 400:
            message, err_type, param = error_message(status, raw)
            raise UpstreamError(message, status=status, err_type=err_type, param=param)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise BadGatewayError(f"vLLM answered {path} with invalid JSON: {error}") from error

    # ----------------------------------------------------------------- generation

    def vllm_model(self, requested: str | None, served_model_name: str) -> str:
        """The name to send vLLM: its base name for our base name, else the adapter's name."""
        if requested is None or requested in (served_model_name, self.vllm_model_name):
            return self.vllm_model_name
        return requested

    def max_tokens(self, prompt_ids: Sequence[int], params: RequestSampling) -> int:
        """The token budget (vLLM's completions default is 16 tokens, chat's the context)."""
        if params.max_tokens is not None:
            return params.max_tokens
        left = self.max_model_len - len(prompt_ids)
        if left < 1:
            raise BadRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(prompt_ids)} input tokens. Please reduce the length of "
                "the input messages.",
                param="messages",
            )
        return left

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: RequestSampling,
        *,
        model: str,
        seed: int | None,
        top_logprobs: int = 0,
        affinity: str | None = None,
    ) -> Generation:
        """Sample from vLLM with ``prompt_ids`` as the prompt; every token with its logprob.

        ``affinity`` (a group's key) goes to a router as ``x-session-id``: one replica per key.
        """
        body = completion_request(
            prompt_ids,
            params,
            model=model,
            seed=seed,
            max_tokens=self.max_tokens(prompt_ids, params),
            top_logprobs=top_logprobs,
        )
        headers = {ROUTER_SESSION_HEADER: affinity} if affinity else None
        answer = await self._resent_on_drop(
            functools.partial(self.post_json, "/v1/completions", body, headers=headers)
        )
        return parse_completion(
            answer,
            prompt_ids,
            token_text=self.token_text,
            top_logprobs=top_logprobs,
            stop=params.stop,
            decode=self.decode,
        )

    async def _resent_on_drop(self, send: Callable[[], Awaitable[T]]) -> T:
        """Await ``send()``, a generation request; when a replica is dropped meanwhile
        (`drop_replica`: frozen, dead) it is sent again, since the dropped one may be the
        replica generating it, and would hold it for the whole generation timeout. The
        router no longer routes there, and a request never answered is safe to send again
        (nothing of it was seen)."""
        while True:
            drops = self.drops
            request = asyncio.ensure_future(send())
            self._generating.add(request)
            try:
                return await request
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self.drops == drops or (current is not None and current.cancelling()):
                    raise  # cancelled from outside (an abandoned episode, a closing server)
            finally:
                self._generating.discard(request)

    async def detect_logprobs_mode(self) -> LogprobsMode | None:
        """Find vLLM's ``--logprobs-mode`` by asking for the same token at two temperatures.

        Raw logprobs do not depend on the temperature; processed ones do. Returns ``None``
        when the answers cannot tell (or vLLM reports logits, not logprobs).
        """
        prompt = self.encode(_PROBE_TEXT) or [self.template.eos_token_id]
        seen: list[dict[int, float]] = []
        for temperature in (1.0, 0.5):
            body = {
                "model": self.vllm_model_name,
                "prompt": prompt,
                "max_tokens": 1,
                "temperature": temperature,
                "seed": 0,
                "logprobs": 5,
                "return_tokens_as_token_ids": True,
            }
            answer = await self.post_json("/v1/completions", body)
            try:
                top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
                seen.append({token_id_of(t): float(lp) for t, lp in top.items()})
            except (KeyError, IndexError, TypeError, ValueError):
                return None
        common = seen[0].keys() & seen[1].keys()
        if not common or any(lp > 1e-6 for lps in seen for lp in lps.values()):
            return None
        spread = max(abs(seen[0][t] - seen[1][t]) for t in common)
        return "raw_logprobs" if spread < _SAME_LOGPROB else "processed_logprobs"
