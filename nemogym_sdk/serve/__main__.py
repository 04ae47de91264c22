"""Command line: ``python -m nemogym_sdk.serve`` (also installed as ``nemogym-serve``).

Heavy imports (torch, transformers) happen only after the arguments are parsed, so ``--help``
stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nemogym_sdk.errors import ConfigError, NemoGymError
from nemogym_sdk.serve._deps import require_serve_deps
from nemogym_sdk.serve.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, OutputParsers

if TYPE_CHECKING:
    from nemogym_sdk.serve.backend import CausalLMBackend
    from nemogym_sdk.serve.engine import Mode, ServeEngine
    from nemogym_sdk.serve.vllm_backend import VllmBackend

__all__ = ["build_parser", "main"]

logger = logging.getLogger("nemogym_sdk.serve")


class _ModeAction(argparse.Action):
    """Store ``--mode`` and remember that it was given (its default depends on --backend)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.mode_given = True


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the CLI."""
    parser = argparse.ArgumentParser(
        prog="nemogym-serve",  # also `python -m nemogym_sdk.serve`
        description=(
            "OpenAI/vLLM-compatible CPU model server for NeMo Gym's vllm_model: token ids, "
            "logprobs, the on-policy prefix splice, and vLLM's runtime LoRA routes."
        ),
    )
    _add_server_arguments(parser.add_argument_group("server and model"))
    _add_vllm_arguments(
        parser.add_argument_group("--backend vllm (a vLLM server, or replicas behind vllm-router)")
    )
    _add_turn_arguments(parser.add_argument_group("turns and adapter versions"))
    _add_scripted_arguments(parser.add_argument_group("--mode scripted"))
    return parser


def _add_server_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    group.add_argument(
        "--model", default=None, help="local model directory (default: the built-in tiny model)"
    )
    group.add_argument(
        "--served-model-name",
        default=None,
        help="model name clients send (default: nemogym-tiny, or the --model path)",
    )
    group.add_argument(
        "--backend",
        choices=("transformers", "vllm"),
        default="transformers",
        help=(
            "transformers: the model runs in this process; vllm: generation is forwarded, as "
            "token ids, to the vLLM server at --vllm-url serving the same --model directory"
        ),
    )
    group.add_argument(
        "--device",
        default=None,
        help=(
            "--backend transformers: where the model runs: cpu (default), cuda, cuda:N, or auto "
            "(cuda when torch sees a GPU); vLLM chooses its own device"
        ),
    )
    group.add_argument(
        "--seed", type=int, default=0, help="seed of the tiny model's weights and of sampling"
    )
    group.add_argument(
        "--max-model-len", type=int, default=None, help="context window (default: from config)"
    )
    group.add_argument(
        "--max-num-seqs",
        type=_positive_int,
        default=None,
        metavar="N",
        help=(
            "--backend transformers: most generations decoded together, one forward pass per "
            "token for all of them (vLLM's name; default 64)"
        ),
    )
    group.add_argument(
        "--save-tiny",
        metavar="DIR",
        default=None,
        help="save the tiny model and tokenizer to DIR (loadable with --model) and exit",
    )
    group.add_argument(
        "--record",
        metavar="PATH",
        default=None,
        help="append one JSON line per generation (its sampling parameters, seed, model) to PATH",
    )
    group.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def _add_vllm_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--vllm-url",
        default=None,
        help="--backend vllm: the vLLM server's base URL, e.g. http://127.0.0.1:8011/v1",
    )
    group.add_argument(
        "--replica",
        dest="replicas",
        metavar="URL",
        action="append",
        default=[],
        help=(
            "--backend vllm with --vllm-url a vllm-router: a sampler behind it (repeat for "
            "each); adapters are loaded on every replica, all or nothing, and generations carry "
            "the group's affinity key"
        ),
    )
    group.add_argument(
        "--vllm-timeout",
        type=float,
        default=600.0,
        help="--backend vllm: seconds one generation may take (default 600)",
    )
    group.add_argument(
        "--replica-timeout",
        type=float,
        default=15.0,
        help=(
            "--replica: seconds a replica gets to answer an adapter load or listing; one that "
            "does not is taken out of the router and the publish set until it answers again "
            "and has loaded every version served (default 15)"
        ),
    )
    group.add_argument(
        "--vllm-wait",
        type=float,
        default=60.0,
        help="--backend vllm: seconds to wait at start for vLLM to answer (default 60)",
    )


def _add_turn_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--mode",
        choices=("scripted", "sample"),
        default="scripted",
        action=_ModeAction,
        help=(
            "scripted: tool calls then an answer, scored by the model; sample: real sampling "
            "(default: scripted, or sample with --backend vllm, which serves only sample)"
        ),
    )
    group.add_argument(
        "--logprobs-mode",
        choices=("raw_logprobs", "processed_logprobs"),
        default="raw_logprobs",
        help=(
            "raw_logprobs: log-softmax of the model (vLLM's default); processed_logprobs: of the "
            "distribution sampled from, after temperature/top-k/top-p (what GRPO's ratio needs); "
            "with --backend vllm it must equal the vLLM server's --logprobs-mode (checked at start)"
        ),
    )
    group.add_argument(
        "--history",
        choices=("contiguous", "template"),
        default="contiguous",
        help=(
            "contiguous: each prompt continues the model's own tokens of the earlier turns "
            "(trained = sampled; a template that rewrites history is not followed); template: "
            "each prompt is the chat template's rendering, as plain vLLM's (an episode whose "
            "history the template rewrites parses into several traces; parse with "
            "on_drift='fork') (default: contiguous)"
        ),
    )
    group.add_argument(
        "--adapter-versions",
        type=int,
        default=1,
        metavar="N",
        help=(
            "keep the newest N versions of each LoRA adapter loaded side by side (a load that "
            "names its policy_version, as LoraSync sends, gets a slot of its own); an async "
            "trainer with staleness K needs K + 2 (default 1: one version, reloaded in place)"
        ),
    )
    group.add_argument(
        "--version-policy",
        choices=("pinned", "in_flight"),
        default="pinned",
        help=(
            "which adapter version answers a request for the adapter's name: pinned, the one "
            "the episode started on (read from the conversation); in_flight, the newest "
            "(default pinned)"
        ),
    )
    group.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default=None,
        help=(
            "read the turn's reasoning as vLLM's --reasoning-parser of that name does, into the "
            "message's 'reasoning' (default: none)"
        ),
    )
    group.add_argument(
        "--tool-call-parser",
        choices=(*TOOL_CALL_PARSERS, "none"),
        default="hermes",
        help=(
            "read tool calls as vLLM's --tool-call-parser of that name does (with "
            "--enable-auto-tool-choice); none: no tool calls (default: hermes)"
        ),
    )


def _add_scripted_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--scripted-tool-turns",
        type=int,
        default=2,
        help="scripted mode: how many assistant turns call a tool before answering (default 2)",
    )
    answers = group.add_mutually_exclusive_group()
    answers.add_argument(
        "--scripted-answer", default=None, help="scripted mode: the final text answer"
    )
    answers.add_argument(
        "--scripted-answers",
        metavar="FILE",
        default=None,
        help=(
            "scripted mode: a JSON file choosing the text answer by what the conversation "
            'says: {"default": TEXT, "rules": [{"match": REGEX, "answer": TEXT}, ...]}'
        ),
    )


async def _serve(engine: ServeEngine, host: str, port: int) -> int:
    from nemogym_sdk.serve.app import start_server
    from nemogym_sdk.serve.errors import ServeError

    try:
        server = await start_server(engine, host=host, port=port)
    except ServeError as error:
        see = f" (see {error.troubleshooting_url()})"
        print(f"nemogym_sdk.serve: error: {error}{see}", file=sys.stderr, flush=True)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    upstream = f" vllm={engine.proxy.vllm_url}" if engine.proxy is not None else ""
    device = getattr(engine.backend, "device", None)
    upstream += f" device={device}" if device is not None else ""
    print(
        f"nemogym_sdk.serve ready: model={engine.served_model_name} mode={engine.mode} "
        f"base_url={server.base_url} logprobs={engine.logprobs_mode} history={engine.history}"
        f"{upstream}",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        logger.info("shutting down")
        await server.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit status."""
    args = build_parser().parse_args(argv)
    try:
        require_serve_deps()  # without the serve extra: one line naming it, not a traceback
        if args.save_tiny is not None:
            from nemogym_sdk.serve.tiny import save_tiny

            print(
                f"saved the tiny model to {save_tiny(args.save_tiny, seed=args.seed)}", flush=True
            )
            return 0
        engine = _engine(args)
    except (ImportError, OSError, ValueError) as error:
        see = f" (see {error.troubleshooting_url()})" if isinstance(error, NemoGymError) else ""
        print(f"nemogym_sdk.serve: error: {error}{see}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(_serve(engine, args.host, args.port))
    finally:
        if engine.recorder is not None:
            engine.recorder.close()


def _engine(args: argparse.Namespace) -> ServeEngine:
    from nemogym_sdk.serve.engine import ServeEngine
    from nemogym_sdk.serve.record import SamplingRecorder
    from nemogym_sdk.serve.script import DEFAULT_SCRIPTED_ANSWER, Script
    from nemogym_sdk.serve.versions import ServedVersions

    recorder = SamplingRecorder(args.record) if args.record else None
    backend: CausalLMBackend | VllmBackend
    if args.replicas and args.backend != "vllm":
        raise ConfigError("--replica is for --backend vllm (a proxy in front of a router)")
    if args.backend == "vllm":
        from nemogym_sdk.serve.vllm_backend import VllmBackend

        if args.vllm_url is None or args.model is None:
            raise ConfigError(
                "--backend vllm needs --vllm-url and --model (the directory vLLM serves)"
            )
        if args.device is not None:
            raise ConfigError(
                "--device is for --backend transformers; with --backend vllm the vLLM server "
                "chooses its device"
            )
        if args.max_num_seqs is not None:
            raise ConfigError(
                "--max-num-seqs is for --backend transformers; with --backend vllm, give it to "
                "the vLLM server"
            )
        backend = VllmBackend.from_pretrained(
            args.model,
            args.vllm_url,
            max_model_len=args.max_model_len,
            timeout=args.vllm_timeout,
            connect_wait=args.vllm_wait,
            replicas=args.replicas,
            replica_timeout=args.replica_timeout,
        )
        # None: the base model keeps vLLM's served name (read from vLLM at start).
        served_model_name = args.served_model_name
    else:
        from nemogym_sdk.devices import torch_device
        from nemogym_sdk.serve.backend import DEFAULT_MAX_BATCH, CausalLMBackend
        from nemogym_sdk.serve.tiny import TINY_MODEL_NAME

        device = torch_device(args.device or "cpu")
        max_batch = args.max_num_seqs or DEFAULT_MAX_BATCH
        if args.model is None:
            backend = CausalLMBackend.tiny(args.seed, device=device, max_batch=max_batch)
            if args.max_model_len is not None:
                backend.max_model_len = args.max_model_len
        else:
            backend = CausalLMBackend.from_pretrained(
                args.model, max_model_len=args.max_model_len, device=device, max_batch=max_batch
            )
        served_model_name = args.served_model_name or (
            TINY_MODEL_NAME if args.model is None else args.model
        )
    given = getattr(args, "mode_given", False)
    mode: Mode = "sample" if args.backend == "vllm" and not given else args.mode
    return ServeEngine(
        backend,
        served_model_name=served_model_name,
        mode=mode,
        scripted_tool_turns=args.scripted_tool_turns,
        scripted_answer=(
            Script.from_file(args.scripted_answers)
            if args.scripted_answers
            else args.scripted_answer or DEFAULT_SCRIPTED_ANSWER
        ),
        seed=args.seed,
        logprobs_mode=args.logprobs_mode,
        recorder=recorder,
        versions=ServedVersions(args.adapter_versions, args.version_policy),
        parsers=OutputParsers(
            reasoning=args.reasoning_parser,
            tool_calls=None if args.tool_call_parser == "none" else args.tool_call_parser,
        ),
        history=args.history,
    )


if __name__ == "__main__":
    sys.exit(main())
