"""Every code block on the site runs, or is checked as what it is.

The rule, for every fenced block of ``docs/**/*.md`` and ``README.md``
(``docs/contributing-docs.md`` says the same for writers):

- ```` ```python ````: run, as a standalone script in a fresh ``python`` (this venv's) with
  a temporary directory as working directory, within 60 s. So a block is self-contained
  and CPU-quick. A longer one is a file under ``examples/docs/`` included with
  ``--8<-- "examples/docs/xyz.py"`` (pymdownx.snippets, paths from the repository root),
  run by ``test_example_file`` here (or a section of it, ``--8<-- "examples/docs/xyz.py:name"``:
  the block shows part of a file that runs). Code that uses ``nemogym_sdk.gym`` (real NeMo
  Gym servers), in a block or a file, is run by the gym-marked
  ``tests/gym/test_docs_examples.py`` instead. A block of nothing but sections of a file
  ``blocks.EXCERPTED`` names (``--8<-- "nemogym_sdk/gym/envs/target_chars/app.py:server"``:
  code of the package or of ``examples/`` that other tests run) is shown, not run.
  ``blocks.PENDING`` (empty) would xfail a block that does not run yet.
- ```` ```bash ````, ```` ```sh ````, ```` ```console ```` (only its ``$ `` lines): every
  command is checked without running it: ``nemogym-train ...``, ``python -m
  nemogym_sdk.train ...`` and ``torchrun ... -m nemogym_sdk.train ...`` are parsed by the
  trainer's real ``parse_config`` (a ``--config FILE`` must exist in the repository);
  ``nemogym-serve ...`` / ``python -m nemogym_sdk.serve ...`` by the server's real argument
  parser; ``make X``: X is a Makefile target; ``pip install "nemogym-sdk[a,b]"`` (or
  ``".[a,b]"``): each extra exists in pyproject.toml; ``python path.py``: the file exists;
  ``python -m nemogym_sdk.X`` / ``torchrun -m X``: the module exists. The reader's own
  paths are not checked: a ``--model`` or ``--env-path`` directory that is not in the
  repository, and a ``...`` word (more flags). Other commands pass only if
  ``blocks.ALLOWED_COMMANDS`` names them (git, curl, gym, vllm ...); any other command fails.
- ```` ```yaml ```` / ```` ```json ````: parsed. A YAML block right after a line
  ``<!-- config: nemogym-train -->`` is a whole ``nemogym-train --config`` file, validated
  by ``parse_config``; after ``<!-- config: axolotl -->`` an axolotl config, whose
  ``nemo_gym_*`` keys are validated by the plugin (``NemoGymArgs``, ``NemoGymSettings``).
- ```` ```text ```` or no language: output and illustrations, not run.

Any other language fails: say ``text`` when a block is not meant to run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.docs.blocks import (
    EXCERPTED,
    PENDING,
    REPO,
    Block,
    all_blocks,
    as_param,
    check_command,
    check_train,
    command_lines,
    example_files,
    included,
    python_blocks,
    run_script,
    split_commands,
    split_include,
    wheel_name,
)

BLOCKS = all_blocks()
SHELL = [b for b in BLOCKS if b.language in ("bash", "sh", "shell", "console")]
DATA = [b for b in BLOCKS if b.language in ("yaml", "yml", "json")]
KNOWN = {"python", "py", "bash", "sh", "shell", "console", "yaml", "yml", "json", "", "text", "txt"}
TIMEOUT_S = 60


def test_every_block_has_a_known_language() -> None:
    unknown = [f"{b.where} ({b.language})" for b in BLOCKS if b.language not in KNOWN]
    assert not unknown, f"blocks in a language the docs test does not check: {unknown}"


def test_python_blocks_include_only_files_a_test_runs() -> None:
    """``--8<--`` in a python block names an existing file of ``examples/docs/`` (or a
    section of one), or a section of a file ``blocks.EXCERPTED`` names, in a block of
    nothing but such lines; every section exists."""
    wrong = []
    for b in BLOCKS:
        if b.language not in ("python", "py"):
            continue
        for spec in b.snippets:
            path, section = split_include(spec)
            excerpt = any(path.startswith(prefix) for prefix in EXCERPTED)
            if not (path.startswith("examples/docs/") or excerpt) or not (REPO / path).is_file():
                wrong.append(f"{b.where}: {spec}: not a file of examples/docs/ nor EXCERPTED")
            elif excerpt and (section is None or not b.only_includes):
                wrong.append(f"{b.where}: {spec}: only sections, in a block of includes only")
            else:
                try:
                    included(spec)
                except ValueError as exc:
                    wrong.append(f"{b.where}: {exc}")
    assert not wrong, "python blocks include what no test runs:\n" + "\n".join(wrong)


def test_excerpted_files_are_run_by_the_tests_named() -> None:
    """Each ``blocks.EXCERPTED`` entry exists, and so do the tests said to run it."""
    missing = [
        path
        for prefix, tests in EXCERPTED.items()
        for path in (prefix, *tests)
        if not (REPO / path).exists()
    ]
    assert not missing, f"blocks.EXCERPTED names what does not exist: {missing}"


def test_pending_blocks_exist() -> None:
    """Every entry of ``blocks.PENDING`` still names a block (drop it once the block runs)."""
    stale = [key for key in PENDING if not any(b.key.startswith(key) for b in BLOCKS)]
    assert not stale, f"PENDING names blocks that are gone: {stale}"


@pytest.mark.parametrize("block", [as_param(b) for b in python_blocks(gym=False)])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    """Each python block that starts no NeMo Gym server, as a script of its own."""
    code = block.expanded()
    (tmp_path / "block.py").write_text(code)
    done = run_script(tmp_path / "block.py", tmp_path, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{block.where} failed:\n{code}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.where)
def test_shell_block_commands_are_real(block: Block) -> None:
    problems = [
        f"{line!r}: {why}"
        for line in command_lines(block)
        for words in split_commands(line)
        if (why := check_command(words)) is not None
    ]
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


@pytest.mark.parametrize("block", DATA, ids=lambda b: b.where)
def test_config_block_parses(block: Block, tmp_path: Path) -> None:
    text = block.expanded()
    if block.language == "json":
        json.loads(text)
        return
    documents = list(yaml.safe_load_all(text))
    if block.marker == "nemogym-train":
        path = tmp_path / "run.yaml"
        path.write_text(text)
        model = documents[0].get("model") if isinstance(documents[0], dict) else None
        extra = ["--model", "tiny"] if model and not (REPO / str(model)).exists() else []
        why = check_train(["--config", str(path), *extra])
        assert why is None, f"{block.where}: not a valid nemogym-train config: {why}"
    elif block.marker == "axolotl":
        args = pytest.importorskip("nemogym_sdk.adapters.axolotl.args")  # needs pydantic
        from nemogym_sdk.adapters.axolotl.settings import NemoGymSettings

        (config,) = documents
        ours = {k: v for k, v in config.items() if k.startswith("nemo_gym_")}
        unknown = set(ours) - set(args.NemoGymArgs.model_fields)
        assert not unknown, f"{block.where}: the plugin has no setting {sorted(unknown)}"
        args.NemoGymArgs.model_validate(ours)
        NemoGymSettings.from_cfg(config)
    else:
        assert block.marker is None, f"{block.where}: unknown config kind {block.marker!r}"


@pytest.mark.parametrize("path", example_files(gym=False), ids=lambda p: str(p.relative_to(REPO)))
def test_example_file(path: Path, tmp_path: Path) -> None:
    """Each file of ``examples/docs/`` that starts no NeMo Gym server, as a script."""
    done = run_script(path, tmp_path, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{path.relative_to(REPO)} failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("pip install nemogym-sdk[train]", "on no package index yet"),
        ("pip install nemogym_sdk==0.1.0", "on no package index yet"),
        ("pip install dist/nemogym_sdk-0.0.1-py3-none-any.whl[train]", "`make dist` builds"),
        ("pip install .[nope]", "no extra ['nope']"),
        ("pip install -e .[train,trl]", None),
        (f"pip install dist/{wheel_name()}[train]", None),
        ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu", None),
    ],
)
def test_an_install_command_must_be_one_the_project_can_satisfy(
    command: str, why: str | None
) -> None:
    """The check behind the shell blocks' pip commands: the SDK from a checkout or this
    version's wheel, with extras that exist; never from an index it is not on."""
    problem = check_command(command.split())
    assert (problem is None) if why is None else (problem is not None and why in problem)


CODE_LINE_LIMIT = 110
"""Characters of a code line that fit a code block at 1280 px (docs/stylesheets/extra.css)."""


def test_code_lines_fit_the_page_at_1280_px() -> None:
    """No line of a code block (output and diagrams aside: ``text`` blocks wrap) is longer
    than what the site's CSS fits at 1280 px, so no block scrolls sideways there."""
    long = [
        f"{block.where} +{number}: {len(line)} characters"
        for block in BLOCKS
        if block.language != "text"
        for number, line in enumerate(block.expanded().splitlines())
        if len(line) > CODE_LINE_LIMIT
    ]
    assert not long, "\n".join(long)
