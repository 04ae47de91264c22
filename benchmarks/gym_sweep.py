"""Which shipped NeMo Gym environments run on this machine: start, play, score, classify.

For every environment NeMo Gym ships (``resources_servers/<name>`` in the gym venv), one at a
time: start it through `GymStack` (its per-server requirements installed, judges wired to the
policy's backend), play its first example rows through `AgentClient` against
``python -m nemogym_sdk.serve --mode scripted`` (answering as ``benchmarks/gym_answers.json``
says for the environments and judges that parse what they are told), and classify the
outcome:

  runs          at least one example row came back as a scored rollout
  gpu           needs a GPU
  sandbox       needs docker or a sandbox
  external      needs an external service or an API key
  requirements  its requirements fail to install
  start         it does not start
  run           it starts but ``/run`` fails on every row
  library       its config says it is no standalone server (code other servers import)
  data          its config names example rows the installed nemo-gym does not ship

each with a one-line reason. What an environment needs is read from its files first (its
requirements, config and code: `hints`) and used to explain a failure; an environment is
never skipped on a hint alone (nor on `KNOWN_CAUSES`, causes a failure does not show).
Results go to ``--out`` (one JSON line per environment, as they
finish, so an interrupted sweep keeps what it measured) and, with ``--docs``, to the table
between the sweep markers of ``docs/gym-environments.md``.

    .venv/bin/python benchmarks/gym_sweep.py --docs docs/gym-environments.md
    .venv/bin/python benchmarks/gym_sweep.py --environments wordle,blackjack --out /tmp/sweep.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk import AgentClient, RolloutStatus, Timeouts
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    DatasetMissingError,
    GymStack,
    GymVenv,
    PolicyModel,
    ServerDirectoryMissingError,
    build_stack_config,
    find_gym_venv,
    start_serve,
)
from nemogym_sdk.gym.loading import load_environment_config, server_type_of
from nemogym_sdk.gym.locate import locate_environment
from nemogym_sdk.gym.requirements import read_server_requirements
from nemogym_sdk.gym.resolve import resolve_each
from nemogym_sdk.gym.specs import AGENTS
from nemogym_sdk.processes import tail
from nemogym_sdk.serve.tiny import build_tiny_tokenizer

CLASSES = {
    "runs": "runs",
    "gpu": "needs a GPU",
    "sandbox": "needs docker or a sandbox",
    "external": "needs an external service or API key",
    "requirements": "requirements fail to install",
    "start": "start fails",
    "run": "`/run` fails",
    "library": "not an environment (a library)",
    "data": "example rows not shipped",
}
"""Outcome classes, in the order the table lists them."""

BEGIN, END = "<!-- gym-sweep:begin -->", "<!-- gym-sweep:end -->"
REPO = Path(__file__).resolve().parents[1]
ANSWERS = Path(__file__).with_name("gym_answers.json")
"""What the scripted policy and judges answer, per kind of request: the formats some
environments parse (an ``<action>`` tag, a judge's JSON verdict)."""

_GPU_PACKAGES = re.compile(
    r"^(vllm|flash[-_]attn|xformers|bitsandbytes|deepspeed|cupy\S*|nvidia-\S+|triton|"
    r"tensorrt\S*|sglang)\b",
    re.I,
)
_GPU_CODE = re.compile(r"\bimport vllm\b|\bfrom vllm\b|torch\.cuda\.|\bcuda:\d|\bdevice=.cuda")
_SANDBOX_CODE = re.compile(
    r"\bimport docker\b|\bdocker (run|exec|build)\b|\bdocker[- ]compose\b|\bapptainer\b|"
    r"\bsingularity\b|\bimport e2b\b|\bimport modal\b|sandbox_fusion|\bsandbox_url\b|"
    r"\bsandbox_host\b|\bsandbox_provider\b|\bAsyncSandbox\b|\bopensandbox\b",
    re.I,
)
_LIBRARY = re.compile(r"not a standalone server", re.I)

_EXTERNAL_PACKAGES = re.compile(r"^(tavily[-_]python|serpapi|exa[-_]py|google-search\S*)\b", re.I)
_GIT_SOURCE = re.compile(r"git(?:\+|\s*=\s*\")(https?://[^\s\"@#]+)")
_LOCAL_VLLM_CONFIG = re.compile(
    r"\b(vllm_serve_kwargs|tensor_parallel_size|gpu_memory_utilization)\b"
)
_EXTERNAL_CONFIG = re.compile(r"api_key|API_KEY|_TOKEN\b|\?\?\?")

_FAILURE_MARKERS = (
    ("gpu", re.compile(r"CUDA|cuda|nvidia|NVIDIA|GPU|no accelerator", re.S)),
    ("sandbox", re.compile(r"docker|sandbox|apptainer|singularity", re.S | re.I)),
    (
        "external",
        re.compile(
            r"api[_ ]?key|API[_ ]KEY|Unauthorized|Forbidden|\b(status|HTTP|code)\W{0,3}40[13]\b|"
            r"Name or service not known|Could not resolve host|github\.com|"
            r"nltk\.download|NLTK Downloader|Resource '?[\w/]+'? not found|"
            r"Temporary failure in name resolution|getaddrinfo|huggingface\.co|"
            r"MissingMandatoryValue|Missing mandatory value",
            re.S,
        ),
    ),
)


KNOWN_CAUSES: dict[str, tuple[str, str]] = {
    "gdp_pdf": (
        "external",
        "its page manifests are made by benchmarks/gdp_pdf/prepare.py, which downloads the "
        "PDFs from Hugging Face (surgeai/GDP.pdf)",
    ),
    "indian_banking": (
        "external",
        "its customer database and knowledge base (data/db.json, data/kb.json) come from a "
        "Hugging Face dataset (configs/indian_banking.yaml)",
    ),
    "scicode": (
        "external",
        "needs SciCode's test_data.h5 (about 1 GB, from Google Drive: benchmarks/scicode/"
        "README.md) and test_data_fpath set",
    ),
    "terminal_bench_4": (
        "sandbox",
        "needs an OpenSandbox deployment, and downloads its task packages from the Harbor "
        "registry on first seed (task.py; retried without end when unreachable)",
    ),
    "vibench": (
        "sandbox",
        "needs a ViBench checkout from GitHub (VIBENCH_REPO_ROOT), a docker build sandbox, "
        "docker-compose grading and grader LLM keys",
    ),
}
"""Causes read in an environment's code and docs that its failure does not show (a download
retried without end reads as a timeout, a missing checkout as FileNotFoundError). Like
`hints`, used only to explain a failure; they outrank what `hints` finds."""


@attrs.frozen(kw_only=True)
class Outcome:
    """One environment's result."""

    environment: str
    outcome: str
    """A key of `CLASSES`."""
    reason: str
    """One line."""
    rows_played: int = 0
    rows_scored: int = 0
    mean_reward: float | None = None
    seconds: float = 0.0


# ----------------------------------------------------------------------- what it needs


def _requirement_names(directory: Path) -> list[str]:
    """The packages a server installs (read as `GymStack` reads them), by name."""
    try:
        packages = read_server_requirements(directory).packages
    except ConfigError:
        return []
    return [re.split(r"[\s<>=!~;\[@]", line, maxsplit=1)[0] for line in packages]


def hints(directory: Path, config: Path, agents: Sequence[Path] = ()) -> dict[str, str]:
    """Class -> why, for what an environment's files say it needs (GPU, sandbox, external),
    or that it is a library (``library``: its config says it is not a standalone server).

    ``directory`` is its resources server's, ``config`` the config file `GymStack` starts,
    ``agents`` the directories of the agents that config starts (their code is read too).
    """
    found: dict[str, str] = {}
    names = _requirement_names(directory)
    pyproject = directory / "pyproject.toml"
    git = _GIT_SOURCE.findall(pyproject.read_text()) if pyproject.is_file() else []
    requirements = directory / "requirements.txt"
    if requirements.is_file():
        git += _GIT_SOURCE.findall(requirements.read_text())
    if git:
        found["external"] = f"installs from git ({git[0]})"
    gpu = [n for n in names if _GPU_PACKAGES.match(n)]
    if gpu:
        found["gpu"] = f"requirements name {', '.join(gpu)}"
    external = [n for n in names if _EXTERNAL_PACKAGES.match(n)]
    if external:
        found["external"] = f"requirements name {', '.join(external)}"
    for path, label in _code_files(directory, agents):
        text = path.read_text(errors="replace")
        if "gpu" not in found and _GPU_CODE.search(text):
            found["gpu"] = f"{label} uses CUDA or vLLM"
        match = _SANDBOX_CODE.search(text)
        if "sandbox" not in found and match:
            found["sandbox"] = f"{label} uses {match.group(0).strip()}"
    text = config.read_text(errors="replace") if config.is_file() else ""
    if library := _LIBRARY.search(text):
        line = next(ln for ln in text.splitlines() if library.group(0) in ln)
        found["library"] = line.split(":", 1)[-1].strip()
    if "gpu" not in found and (serves := _LOCAL_VLLM_CONFIG.search(text)):
        found["gpu"] = f"{config.name} starts its own vLLM ({serves.group(0)})"
    match = _EXTERNAL_CONFIG.search(text)
    if "external" not in found and match:
        found["external"] = f"{config.name} asks for {match.group(0)}"
    return found


def _code_files(directory: Path, agents: Sequence[Path]) -> Iterable[tuple[Path, str]]:
    """(file, how the table names it) for the Python code of a server and its agents."""
    for root, prefix in ((directory, ""), *((a, f"{a.name}/") for a in agents)):
        for path in sorted(root.rglob("*.py")):
            if "tests" not in path.relative_to(root).parts:
                yield path, f"{prefix}{path.relative_to(root)}"


def _agent_dirs(venv: GymVenv, name: str) -> list[Path]:
    """The directories of the agents ``name``'s config starts (none if it does not load)."""
    try:
        loaded = load_environment_config(venv, name)
    except ConfigError:
        return []
    return [
        venv.server_dir(AGENTS, impl)
        for block in loaded.values()
        if server_type_of(block) == AGENTS
        for impl in block[AGENTS]
    ]


_MISSING_FIELD = re.compile(r"^(\w+)\n\s+Field required", re.M)
_ERROR_LINE = re.compile(
    r"\w*Error\b|\berror\b|\w*Exception\b|Traceback|\bfailed\b|FAILED|refused|denied|"
    r"Unauthorized|Forbidden|not found|No module|\b[Mm]issing\b|\brequired\b|"
    r"^\s*\w*(api_key|_token)\s*$|"  # the field a pydantic ValidationError names
    r"^timeout: "  # what the client reports for a /run that never answered
)
_NOISE = ("For further information visit", "Found ulimit of")
"""Lines that are never the cause: pydantic's link, NeMo Gym's start-up ulimit notice."""


def classify_failure(stage: str, message: str, hinted: dict[str, str]) -> tuple[str, str]:
    """(class, one-line reason) for a failure at ``stage`` (requirements, start, run).

    Only lines that read as errors are searched for causes, so a server's ordinary log
    lines (a port number, a model name) cannot decide the class.
    """
    if "library" in hinted:
        return "library", hinted["library"]
    missing = _MISSING_FIELD.findall(message)  # pydantic: the config lacks these settings
    errors = [
        line
        for line in message.splitlines()
        if _ERROR_LINE.search(line) and not line.strip().startswith(_NOISE)
    ]
    message = "\n".join(errors) or message
    for name, pattern in _FAILURE_MARKERS:
        if pattern.search(message):
            return name, _one_line(message, pattern)
    line = _one_line(message)
    if missing:
        line = f"{line}: {', '.join(dict.fromkeys(missing))} not set"
    for name in ("gpu", "sandbox", "external"):
        if name in hinted:
            return name, f"{hinted[name]}; {stage} failed: {line}"
    return stage, line


_RELAYED = re.compile(r"Hit an exception in \S+ calling an inner server: ")
"""How an agent relays an inner server's error: dropped, so the error itself fits the line."""


def _one_line(message: str, pattern: re.Pattern[str] | None = None) -> str:
    """The most telling line: the one the pattern matched, else the last error-looking one."""
    lines = [
        _RELAYED.sub("", line.strip())
        for line in message.splitlines()
        if line.strip() and not line.strip().startswith(_NOISE)
    ]
    if pattern is not None:
        for line in reversed(lines):
            if pattern.search(line):
                return line[:200]
    errors = [
        line
        for line in lines
        if re.search(r"Error|error|Exception|failed|No module|^timeout: ", line)
    ]
    return (errors or lines or ["(no message)"])[-1][:200]


# ----------------------------------------------------------------------- one environment


def sweep_one(
    venv: GymVenv,
    name: str,
    model: PolicyModel,
    *,
    rows: int,
    workdir: Path,
    ready_timeout: float,
    run_timeout: float,
) -> Outcome:
    """Start ``name``, play up to ``rows`` example rows, classify."""
    began = time.monotonic()
    location = locate_environment(venv, name)
    hinted = hints(location.directory, location.config_path, _agent_dirs(venv, name))
    if name in KNOWN_CAUSES:
        cause, why = KNOWN_CAUSES[name]
        hinted = {cause: why, **{k: v for k, v in hinted.items() if k != cause}}

    def done(outcome: str, reason: str, **extra: Any) -> Outcome:
        return Outcome(
            environment=name,
            outcome=outcome,
            reason=reason,
            seconds=round(time.monotonic() - began, 1),
            **extra,
        )

    stack: GymStack | None = None
    try:
        stack = GymStack(
            [name],
            model,
            venv=venv,
            workdir=workdir,
            ready_timeout=ready_timeout,
            default_max_steps=8,  # a scripted policy that keeps calling tools must end
        ).start()
    except DatasetMissingError as error:
        why = f"{error.config_path.name} names {error.path.name}, which nemo-gym does not ship"
        return done("data", why)
    except ServerDirectoryMissingError as error:
        why = f"{error.server}: {error.directory.name}/ is not a server directory nemo-gym ships"
        return done("start", why)
    except Exception as error:  # noqa: BLE001 -- every failure is an outcome, not the end
        stage = "requirements" if "equirement" in type(error).__name__ else "start"
        message = f"{type(error).__name__}: {error}"
        return done(*classify_failure(stage, message, hinted))
    try:
        setup = stack.environment(name)
        if setup.agent is None:
            allowed = ", ".join(sorted(setup.allowed_agents)) or "-"
            message = f"its config starts no agent (allowed_agents: {allowed})"
            return done(*classify_failure("start", message, hinted))
        examples = stack.example_rows(name)[:rows]
        if not examples:
            return done("run", "ships no example rows")
        timeouts = Timeouts(request=run_timeout, total=run_timeout * len(examples))
        with AgentClient(stack.directory, default_agent=setup.agent, timeouts=timeouts) as client:
            rollouts = client.run_sync(examples, eos_token_id=build_tiny_tokenizer().eos_token_id)
        scored = [r for r in rollouts if r.status == RolloutStatus.OK and math.isfinite(r.reward)]
        if scored:
            mean = sum(r.reward for r in scored) / len(scored)
            return done(
                "runs",
                f"{len(scored)}/{len(rollouts)} example rows scored",
                rows_played=len(rollouts),
                rows_scored=len(scored),
                mean_reward=round(mean, 4),
            )
        reasons = "; ".join(sorted({f"{r.status.value}: {r.error}" for r in rollouts}))
        logs = "\n".join(tail(path, 40) for path in stack.log_paths.values())
        outcome, line = classify_failure("run", f"{logs}\n{reasons}", hinted)
        if outcome == "run":  # no cause named anywhere: what the client saw says most
            line = _one_line(reasons)
        return done(outcome, line, rows_played=len(rollouts))
    except Exception:  # noqa: BLE001 -- as above
        return done(*classify_failure("run", traceback.format_exc(limit=3), hinted))
    finally:
        stack.stop()


# ----------------------------------------------------------------------- all of them


def shipped_environments(venv: GymVenv) -> list[str]:
    """Every resources server NeMo Gym ships that has a config: by its name, or, when it
    has no config of its own name, as ``<name>:<its first config>``; then every other
    config naming example rows the wheel does not ship (so the table lists each)."""
    root = venv.site_packages / "resources_servers"
    names, others = [], []
    for directory in sorted(p for p in root.iterdir() if (p / "configs").is_dir()):
        configs = sorted((directory / "configs").glob("*.yaml"))
        if any(c.stem == directory.name for c in configs):
            names.append(directory.name)
        elif configs:
            names.append(f"{directory.name}:{_variant_for_examples(directory, configs).stem}")
        others += [f"{directory.name}:{c.stem}" for c in configs if c.stem != directory.name]
    return names + _without_example_rows(venv, [n for n in others if n not in names])


def _without_example_rows(venv: GymVenv, names: Sequence[str]) -> list[str]:
    """Those of ``names`` whose config builds but names example rows that are not there
    (all resolved in one request to the NeMo Gym worker)."""
    resolve_each(venv, names)
    model = PolicyModel(base_url="http://127.0.0.1:1/v1", model="none")
    found = []
    for name in names:
        try:
            config = build_stack_config(
                venv, [name], model, allocate_ports=lambda n: list(range(20000, 20000 + n))
            )
        except ConfigError:
            continue
        if not all(setup.example_path.is_file() for setup in config.environments):
            found.append(name)
    return found


def _variant_for_examples(directory: Path, configs: Sequence[Path]) -> Path:
    """The config defining the agent the example rows name (``agent_ref``), else the first."""
    example = directory / "data" / "example.jsonl"
    first = example.read_text().split("\n", 1)[0] if example.is_file() else ""
    try:
        agent = (json.loads(first).get("agent_ref") or {}).get("name")
    except (json.JSONDecodeError, AttributeError):
        agent = None
    for config in configs:
        if agent and re.search(rf"^{re.escape(agent)}:", config.read_text(), re.M):
            return config
    return configs[0]


def table(outcomes: Sequence[Outcome], *, command: str) -> str:
    """The markdown the docs show: counts per class, then one row per environment.

    The time is the sum of the environments' own times (start, play, stop), so it is the
    sweep's wall time even when ``--resume`` assembled it from several invocations.
    """
    counts = Counter(o.outcome for o in outcomes)
    today = datetime.date.today().isoformat()
    minutes = sum(o.seconds for o in outcomes) / 60
    lines = [
        f"Generated {today} by `{command}`: {len(outcomes)} environments in {minutes:.0f} min "
        "(2 CPU cores, scripted policy and judges).",
        "",
        "| outcome | environments |",
        "|---|---|",
        *(f"| {CLASSES[key]} | {counts[key]} |" for key in CLASSES if counts[key]),
        "",
        "| environment | outcome | reason | mean reward |",
        "|---|---|---|---|",
    ]
    for o in sorted(outcomes, key=lambda o: (list(CLASSES).index(o.outcome), o.environment)):
        reward = "" if o.mean_reward is None else f"{o.mean_reward:.2f}"
        reason = _cell(_tidy(o.reason))
        lines.append(f"| `{o.environment}` | {CLASSES[o.outcome]} | {reason} | {reward} |")
    return "\n".join(lines) + "\n"


_MACHINE_PATHS = (
    (re.compile(r"/[^\s'\"]*?/server-envs/[\w.-]+/"), "<server venv>/"),
    (re.compile(r"/[^\s'\"]*?/site-packages/"), "<site-packages>/"),
    (re.compile(re.escape(str(REPO)) + r"/?"), ""),  # the repository's files: relative paths
    (re.compile(r"/tmp/tmp\w+/"), "<workdir>/"),
    (re.compile(r"(?<![\w.-])(?:/root|/home/[^/\s'\"]+)/"), "~/"),
    (re.compile(r"/(?:tmp|work)/"), "<path>/"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
)


def _tidy(reason: str) -> str:
    """A reason without this machine's paths and ports, as the docs show it."""
    for pattern, replacement in _MACHINE_PATHS:
        reason = pattern.sub(replacement, reason)
    return reason


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: one line, ``|`` escaped, and ``<``/``>`` as
    entities outside code spans, so ``<port>`` is shown, not taken for an HTML tag."""
    text = text.replace("|", "\\|").replace("\n", " ")
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unbalanced backtick: no code spans
        parts = [text]
    return "`".join(
        part.replace("<", "&lt;").replace(">", "&gt;") if index % 2 == 0 else part
        for index, part in enumerate(parts)
    )


def write_docs(path: Path, markdown: str) -> None:
    """Replace what is between the sweep markers of ``path`` with ``markdown``."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers to write between")
    head, rest = text.split(BEGIN, 1)
    _, tail_text = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown}{END}{tail_text}")


def _load(path: Path) -> dict[str, Outcome]:
    if not path.is_file():
        return {}
    done = {}
    for line in path.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            done[data["environment"]] = Outcome(**data)
    return done


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--environments", help="comma-separated names (default: all shipped)")
    parser.add_argument("--rows", type=int, default=2, help="example rows per environment")
    parser.add_argument("--out", type=Path, default=Path("runs/gym_sweep.jsonl"))
    parser.add_argument("--resume", action="store_true", help="skip environments in --out")
    parser.add_argument(
        "--update",
        action="store_true",
        help="sweep --environments again, keep the other results in --out; table of all",
    )
    parser.add_argument(
        "--scripted-answers",
        type=Path,
        default=ANSWERS,
        help="the scripted policy's and judges' answers, by what a request says "
        f"(default: {ANSWERS.relative_to(REPO)}; see nemogym_sdk.serve.script)",
    )
    parser.add_argument("--docs", type=Path, help="write the table into this markdown file")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--run-timeout", type=float, default=180.0)
    parser.add_argument(
        "--report-only", action="store_true", help="write the table from --out, start nothing"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.update and not args.environments:
        parser.error("--update needs --environments (the ones to sweep again)")
    venv = find_gym_venv()
    names = (
        [n.strip() for n in args.environments.split(",") if n.strip()]
        if args.environments
        else shipped_environments(venv)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = _load(args.out) if args.resume or args.report_only or args.update else {}
    if not args.report_only:
        if not (args.resume or args.update):
            args.out.write_text("")
        _sweep(
            venv, names if args.update else [n for n in names if n not in results], results, args
        )
    if args.update:  # one line per environment again, the new results in place of the old
        args.out.write_text("".join(json.dumps(attrs.asdict(o)) + "\n" for o in results.values()))
        names = list(results)
    outcomes = [results[n] for n in names if n in results]
    command = "python benchmarks/gym_sweep.py" + (f" --rows {args.rows}" if args.rows != 2 else "")
    markdown = table(outcomes, command=command)
    print(markdown)
    if args.docs is not None:
        write_docs(args.docs, markdown)
    return 0


def _sweep(
    venv: GymVenv, names: Sequence[str], results: dict[str, Outcome], args: argparse.Namespace
) -> None:
    """Sweep ``names`` one by one against one scripted server; each result appended to
    ``args.out`` as it is known."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_serve(
            mode="scripted",
            logprobs_mode="raw_logprobs",
            log_path=Path(tmp) / "serve.log",
            # Rows ask for up to 131072 new tokens (aegis_v4_safety); a smaller context
            # makes vllm_model answer with an empty "length" completion, as vLLM would.
            extra_args=[
                *("--scripted-answers", str(args.scripted_answers)),
                *("--max-model-len", "262144"),
            ],
        ) as served,
    ):
        model = served.policy_model()
        for index, name in enumerate(names, 1):
            outcome = sweep_one(
                venv,
                name,
                model,
                rows=args.rows,
                workdir=Path(tmp) / name.replace(":", "_"),
                ready_timeout=args.ready_timeout,
                run_timeout=args.run_timeout,
            )
            results[name] = outcome
            with args.out.open("a") as out:
                out.write(json.dumps(attrs.asdict(outcome)) + "\n")
            print(
                f"[{index}/{len(names)}] {name}: {CLASSES[outcome.outcome]} "
                f"({outcome.seconds:.0f} s) {outcome.reason}",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
