"""The fenced code blocks of the site's pages (and README.md), and the checks of their commands.

Helpers for ``test_code_blocks.py``, which states the rule every block follows. Nothing here
runs a command: a command line is parsed by the real parser of what it starts, or looked up
(a Makefile target, an extra, a file, a module).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = (*sorted(DOCS.rglob("*.md")), REPO / "README.md")
"""Every page of the site, and the README (not a page, same rule)."""
EXAMPLES = REPO / "examples" / "docs"
"""Files a page includes with ``--8<--``; each is run by a test."""
RUN_ELSEWHERE: frozenset[str] = frozenset(
    {
        "examples/docs/env_mask.py",  # tests/docs/test_shown_output.py: output on the page
        "examples/docs/quickstart.py",  # tests/docs/test_examples_gym.py, output checked
        "examples/docs/remote_gym.py",  # tests/docs/test_examples_gym.py: a head-mode stack
        "examples/docs/discover.py",  # tests/docs/test_examples_gym.py: the same stack
    }
)
"""Files under ``examples/docs/`` another test already runs (paths from the repository)."""
EXCERPTED: dict[str, tuple[str, ...]] = {
    "nemogym_sdk/gym/envs/target_chars/": ("tests/test_toy_rules.py", "tests/gym/test_toy_env.py"),
    "examples/torch_grpo.py": ("tests/gym/test_training.py",),
    "tests/gym/trl_async.py": ("tests/gym/test_trl_async.py",),
}
"""Files outside ``examples/docs/`` whose sections a python block may show, by path prefix ->
the tests that run them. Such a block holds only ``--8<-- "path:name"`` lines; each shows
the lines between ``# --8<-- [start:name]`` and ``# --8<-- [end:name]``, dedented
(``dedent_subsections`` in mkdocs.yml). It is shown, not run: those tests run the code."""

PENDING: dict[str, str] = {}
"""Python blocks not run yet (none now: keep it empty): the page's path and the start of the
block's first line -> why it does not run; such a block is xfailed. An entry whose block is
gone fails ``test_pending_blocks_exist``."""


ALLOWED_COMMANDS = frozenset(
    {
        # other tools a page tells the reader to run; their arguments are theirs to check
        "axolotl",  # axolotl's CLI (its config is checked as a `<!-- config: axolotl -->` block)
        "cd",
        "curl",
        "export",
        "git",
        "gym",  # NeMo Gym's CLI
        "hf",
        "huggingface-cli",
        "mkdir",
        "mlflow",  # experiment trackers (docs/tracking.md)
        "nvidia-smi",
        "pytest",
        "tensorboard",
        "trackio",
        "uv",
        "vllm",
        "vllm-router",
        "wandb",
    }
)
"""Commands a shell block may run besides the SDK's own, ``make``, ``pip``, ``python`` and
``torchrun`` (which are checked)."""
EXTERNAL_MODULES = ("vllm", "pytest", "venv", "pip")
"""``python -m`` modules of other projects (vLLM lives in its own venv)."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"<!--\s*config:\s*(?P<kind>[\w-]+)\s*-->")
_SNIPPET = re.compile(r"^\s*-{1,}8<-{1,}\s+[\"'](?P<path>[^\"']+)[\"']\s*$")
_INCLUDE = re.compile(r"(?P<path>[^:]+)(?::(?P<section>[a-z][-_0-9a-z]*))?")
_SECTION = re.compile(r"-{1,}8<-{1,}[ \t]+\[[ \t]*(?P<end>start|end)[ \t]*:[ \t]*(?P<name>[-\w]+)")
_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_PIP = re.compile(r"^(?:.*/)?pip3?$")
_EXTRAS = re.compile(r"^(?P<source>\.|\./|dist/[^\[\s]+\.whl)\[(?P<extras>[\w,\s-]+)\]$")
_FROM_AN_INDEX = re.compile(r"^nemogym[-_]sdk(?:\[.*\])?(?:[=<>~!].*)?$")
_WHEEL = re.compile(r"^dist/nemogym_sdk-(?P<version>[^-]+)-py3-none-any\.whl$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@attrs.frozen
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    """1-based line of the opening fence."""
    language: str
    """First word of the info string, lower case ("" when none)."""
    text: str
    """The content, de-indented to the fence's indentation."""
    marker: str | None
    """``nemogym-train`` / ``axolotl`` from a ``<!-- config: ... -->`` line right above."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def key(self) -> str:
        """``page: first line``, as ``PENDING`` names a block."""
        first = next((line.strip() for line in self.text.splitlines() if line.strip()), "")
        return f"{self.page.relative_to(REPO)}: {first}"

    @property
    def only_includes(self) -> bool:
        """The block is nothing but ``--8<--`` lines (its files are run on their own)."""
        lines = [line for line in self.text.splitlines() if line.strip()]
        return bool(lines) and all(_SNIPPET.match(line) for line in lines)

    @property
    def snippets(self) -> list[str]:
        """The files the block includes (``--8<-- "path"`` lines)."""
        return [m["path"] for line in self.text.splitlines() if (m := _SNIPPET.match(line))]

    def expanded(self) -> str:
        """The text with every ``--8<--`` line replaced by what it includes."""
        lines = []
        for line in self.text.splitlines():
            match = _SNIPPET.match(line)
            lines.append(included(match["path"]) if match else line)
        return "\n".join(lines) + "\n"


def split_include(spec: str) -> tuple[str, str | None]:
    """``path`` or ``path:section`` (a ``--8<--`` line's target) -> (path, section)."""
    match = _INCLUDE.fullmatch(spec)
    return (match["path"], match["section"]) if match else (spec, None)


def included(spec: str) -> str:
    """What ``--8<-- "spec"`` shows: the whole file, or the lines of its section (between
    ``--8<-- [start:name]`` and ``--8<-- [end:name]``, other markers dropped) dedented, as
    pymdownx.snippets with ``dedent_subsections`` does. ``ValueError`` when there is none."""
    path, section = split_include(spec)
    text = (REPO / path).read_text()
    if section is None:
        return text
    lines: list[str] | None = None
    for line in text.splitlines():
        marker = _SECTION.search(line)
        if marker and marker["name"] == section:
            if marker["end"] == "end":
                break
            lines = [] if lines is None else lines
        elif lines is not None and not marker:
            lines.append(line)
    if lines is not None:
        return textwrap.dedent("\n".join(lines)).rstrip("\n")
    raise ValueError(f"{path} has no section {section!r} (--8<-- [start:{section}] ... [end:...])")


def pending(block: Block) -> str | None:
    """Why ``block`` is not run yet (``PENDING``), or None."""
    return next((why for key, why in PENDING.items() if block.key.startswith(key)), None)


def as_param(block: Block) -> Any:
    """A python block as a test case, not run while it is pending."""
    why = pending(block)
    marks = [pytest.mark.xfail(run=False, reason=why)] if why else []
    return pytest.param(block, id=block.where, marks=marks)


def blocks(page: Path) -> Iterator[Block]:
    """The fenced blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        info = match["info"].strip().lstrip("{.").split()
        body: list[str] = []
        end = index + 1
        closing = re.compile(rf"{re.escape(fence[0])}{{{len(fence)},}}")
        while end < len(lines) and not closing.fullmatch(lines[end].strip()):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = _MARKER.search(above)
        yield Block(
            page=page,
            line=index + 1,
            language=(info[0].rstrip("}").lower() if info else ""),
            text="\n".join(body) + "\n",
            marker=marker["kind"] if marker else None,
        )
        index = end + 1


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def uses_gym(code: str) -> bool:
    """Code that starts real NeMo Gym servers (it imports ``nemogym_sdk.gym``): run by the
    gym-marked ``tests/gym/test_docs_examples.py``."""
    return "from nemogym_sdk.gym" in code or "import nemogym_sdk.gym" in code


def python_blocks(*, gym: bool) -> list[Block]:
    """The python blocks to run (not those that only include files), with or without
    NeMo Gym servers."""
    return [
        block
        for block in all_blocks()
        if block.language in ("python", "py")
        and not block.only_includes
        and uses_gym(block.expanded()) == gym
    ]


def example_files(*, gym: bool) -> list[Path]:
    """The files of ``examples/docs/`` to run, with or without NeMo Gym servers."""
    return sorted(
        path
        for path in EXAMPLES.rglob("*.py")
        if str(path.relative_to(REPO)) not in RUN_ELSEWHERE and uses_gym(path.read_text()) == gym
    )


def run_script(
    script: Path, cwd: Path, *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python script`` in ``cwd``, by a fresh interpreter of this venv."""
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env={**os.environ, "PYTHONNOUSERSITE": "1", "MPLBACKEND": "Agg", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def command_lines(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines
    dropped; in a ``console`` block only the ``$ `` lines (the rest is output)."""
    commands: list[str] = []
    pending = ""
    for raw in block.expanded().splitlines():
        line = raw.rstrip()
        if block.language == "console" and not pending:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    return commands


def split_commands(line: str) -> list[list[str]]:
    """``a && b | c; d`` as ``[[a], [b], [c], [d]]`` (each as its words; comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m[1] for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def extras() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def _user_paths(args: list[str]) -> list[str]:
    """The arguments with what belongs to the reader's machine neutralised: a ``...`` word
    (more flags) is dropped, a ``--model`` that is not in this checkout becomes ``tiny``,
    an ``--env-path`` that is not is dropped."""
    out = [a for a in args if a not in ("...", "…")]
    for index, arg in enumerate(out[:-1]):
        if arg == "--model" and out[index + 1] != "tiny" and not (REPO / out[index + 1]).exists():
            out[index + 1] = "tiny"
    while "--env-path" in out[:-1]:
        index = out.index("--env-path")
        if all((REPO / p).is_dir() for p in out[index + 1].split(",")):
            break
        del out[index : index + 2]
    return out


def _captured(parse: Callable[[], object]) -> str | None:
    """None when ``parse()`` accepts; otherwise what it said."""
    from nemogym_sdk.errors import ConfigError

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse()
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue() else "exit"
    except ConfigError as exc:
        return f"ConfigError: {exc}"
    return None


def check_train(args: list[str]) -> str | None:
    """``nemogym-train ARGS``: parsed and validated by the trainer's own ``parse_config``."""
    from nemogym_sdk.train.config import parse_config

    args = _user_paths(args)
    if "--config" in args:
        position = args.index("--config") + 1
        if position >= len(args) or not (REPO / args[position]).is_file():
            return "--config names no file of the repository"
        args[position] = str(REPO / args[position])
    return _captured(lambda: parse_config(args))


def check_serve(args: list[str]) -> str | None:
    """``nemogym-serve ARGS``: parsed by the server's own argument parser."""
    from nemogym_sdk.serve.__main__ import build_parser

    return _captured(lambda: build_parser().parse_args(_user_paths(args)))


def check_module(module: str, args: list[str]) -> str | None:
    """``python -m MODULE ARGS``."""
    if module in ("nemogym_sdk.train", "nemogym_sdk"):
        return check_train(args) if module == "nemogym_sdk.train" else "not a command"
    if module == "nemogym_sdk.serve":
        return check_serve(args)
    if module.split(".")[0] in EXTERNAL_MODULES:
        return None
    if module.startswith("nemogym_sdk.") and importlib.util.find_spec(module) is not None:
        return None
    return f"python -m {module}: not a module of the SDK nor an allowed one"


def check_pip(args: list[str]) -> str | None:
    """``pip install ...``: the SDK from a source that exists (a checkout, or the wheel
    ``make dist`` builds, of this version; it is on no package index yet), with extras
    that pyproject.toml defines."""
    if not args or args[0] != "install":
        return None if args and args[0] in ("uninstall", "list", "show") else "pip: not install"
    known = extras()
    for arg in args[1:]:
        if _FROM_AN_INDEX.match(arg):
            return (
                f"pip install {arg}: nemogym-sdk is on no package index yet; install it from "
                "a checkout ('.[extra]') or the wheel `make dist` builds"
            )
        match = _EXTRAS.match(arg)
        if match is None:
            continue
        wheel = _WHEEL.match(match["source"])
        if match["source"].startswith("dist/") and (
            wheel is None or wheel["version"] != project_version()
        ):
            return f"pip install {arg}: `make dist` builds dist/{wheel_name()}"
        unknown = {e.strip() for e in match["extras"].split(",")} - known
        if unknown:
            return f"pip install {arg}: no extra {sorted(unknown)} in pyproject.toml"
    return None


def project_version() -> str:
    import nemogym_sdk

    return nemogym_sdk.__version__


def wheel_name() -> str:
    return f"nemogym_sdk-{project_version()}-py3-none-any.whl"


def check_python(args: list[str]) -> str | None:
    """``python -m MODULE ...`` or ``python FILE ...``."""
    rest = [a for a in args if a not in ("-u", "-X", "importtime")]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return check_module(rest[1], rest[2:])
    if rest and rest[0].endswith(".py"):
        return None if (REPO / rest[0]).is_file() else f"python {rest[0]}: no such file"
    return f"python {' '.join(args)}: neither -m MODULE nor a file"


def check_torchrun(args: list[str]) -> str | None:
    """``torchrun ... -m MODULE ARGS``: the module imports; the trainer's flags parse."""
    if "-m" not in args:
        script = next((a for a in args if a.endswith(".py")), None)
        return None if script and (REPO / script).is_file() else "torchrun: no -m MODULE"
    position = args.index("-m")
    module, rest = args[position + 1], args[position + 2 :]
    if importlib.util.find_spec(module) is None:
        return f"torchrun -m {module}: no such module"
    return check_train(rest) if module == "nemogym_sdk.train" else None


def check_command(words: list[str]) -> str | None:
    """None when the command is fine; otherwise why not."""
    while words and _ASSIGNMENT.match(words[0]):  # VAR=value command ...
        words = words[1:]
    if not words:
        return None
    name, args = words[0], words[1:]
    if name == "nemogym-train":
        return check_train(args)
    if name == "nemogym-serve":
        return check_serve(args)
    if name == "make":
        targets = [a for a in args if not _ASSIGNMENT.match(a) and not a.startswith("-")]
        unknown = set(targets) - makefile_targets()
        return f"make: no target {sorted(unknown)} in the Makefile" if unknown else None
    if _PIP.match(name):
        return check_pip(args)
    if _PYTHON.match(name):
        if args[:2] == ["-m", "pip"]:
            return check_pip(args[2:])
        return check_python(args)
    if name == "torchrun":
        return check_torchrun(args)
    if name in ALLOWED_COMMANDS:
        return None
    return f"{name}: not a command the docs test knows (tests/docs/blocks.py ALLOWED_COMMANDS)"
