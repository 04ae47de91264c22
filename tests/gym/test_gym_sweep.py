"""``benchmarks/gym_sweep.py``: its classification rules, and the script on a small subset.

The full sweep (every shipped environment) is a benchmark, run by hand; this runs the same
script end to end on a few environments so it cannot rot (one that runs, a config variant,
a bad name; then ``--update`` with a library and a game that needs the scripted answers),
with the table written between the docs markers.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from nemogym_sdk.gym import GymVenv

REPO = Path(__file__).resolve().parents[2]
NO_ROWS = "structured_outputs:structured_outputs_json_yaml_xml_v1"
"""A shipped config naming example rows the nemo-gym wheel does not ship."""
SCRIPT = REPO / "benchmarks" / "gym_sweep.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gym_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gym_sweep"] = module
    spec.loader.exec_module(module)
    return module


sweep = _load()


def _server(tmp_path: Path, requirements: str, code: str, config: str) -> tuple[Path, Path]:
    directory = tmp_path / "env"
    (directory / "configs").mkdir(parents=True)
    (directory / "requirements.txt").write_text(requirements)
    (directory / "app.py").write_text(code)
    config_path = directory / "configs" / "env.yaml"
    config_path.write_text(config)
    return directory, config_path


def test_hints_read_requirements_code_and_config(tmp_path: Path) -> None:
    """GPU packages, sandbox code and key-needing configs are found; nemo-gym lines ignored."""
    directory, config = _server(
        tmp_path,
        "-e nemo-gym[dev] @ ../../\nvllm==0.9  # fast\ntavily-python\nnumpy\n",
        "import docker\n",
        "judge:\n  api_key: ${oc.env:OPENAI_API_KEY}\n",
    )
    found = sweep.hints(directory, config)
    assert found["gpu"] == "requirements name vllm"
    assert found["external"] == "requirements name tavily-python"
    assert found["sandbox"] == "app.py uses import docker"


def test_a_git_source_is_an_external_service(tmp_path: Path) -> None:
    """A requirement fetched from git (this box, like many clusters, reaches only PyPI)."""
    directory, config = _server(
        tmp_path, "tool @ git+https://github.com/org/tool.git@v1\n", "", "x: 1\n"
    )
    assert sweep.hints(directory, config) == {
        "external": "installs from git (https://github.com/org/tool.git)"
    }
    (directory / "requirements.txt").unlink()
    (directory / "pyproject.toml").write_text(
        '[tool.uv.sources]\ntool = { git = "https://github.com/org/other.git" }\n'
    )
    assert sweep.hints(directory, config)["external"].endswith("(https://github.com/org/other.git)")


def test_a_config_that_starts_its_own_vllm_needs_a_gpu(tmp_path: Path) -> None:
    directory, config = _server(
        tmp_path, "", "", "genrm:\n  vllm_serve_kwargs:\n    tensor_parallel_size: 8\n"
    )
    assert sweep.hints(directory, config) == {
        "gpu": "env.yaml starts its own vLLM (vllm_serve_kwargs)"
    }


def test_hints_are_empty_for_a_plain_environment(tmp_path: Path) -> None:
    directory, config = _server(tmp_path, "numpy\nsympy>=1\n", "import json\n", "x: 1\n")
    assert sweep.hints(directory, config) == {}


def test_the_agents_code_is_read_and_a_library_is_named(tmp_path: Path) -> None:
    """A sandbox its agent needs is found in the agent's code (tests skipped); a config that
    says it is no standalone server is a library, whatever its start-up says."""
    directory, config = _server(tmp_path, "", "import json\n", "x: 1\n")
    agent = tmp_path / "harness_agent"
    (agent / "tests").mkdir(parents=True)
    (agent / "tests" / "test_app.py").write_text("import docker\n")
    assert sweep.hints(directory, config, [agent]) == {}
    (agent / "app.py").write_text("sandbox = AsyncSandbox(spec)\n")
    assert sweep.hints(directory, config, [agent]) == {
        "sandbox": "harness_agent/app.py uses AsyncSandbox"
    }
    config.write_text("lib:\n  description: Shared code. Not a standalone server.\n")
    found = sweep.hints(directory, config)
    assert found == {"library": "Shared code. Not a standalone server."}
    assert sweep.classify_failure("start", "ServerStartError: exited with status 0", found) == (
        "library",
        "Shared code. Not a standalone server.",
    )


def test_a_failure_message_outranks_hints_and_hints_outrank_the_stage() -> None:
    """The message names the cause when it can; else a hint explains it; else the stage."""
    cls, reason = sweep.classify_failure(
        "start", "Traceback\nRuntimeError: Found no NVIDIA driver on your system", {}
    )
    assert (cls, reason) == ("gpu", "RuntimeError: Found no NVIDIA driver on your system")
    assert sweep.classify_failure("start", "RuntimeError: Sandbox not ready after 240s", {}) == (
        "sandbox",
        "RuntimeError: Sandbox not ready after 240s",
    )
    cls, reason = sweep.classify_failure(
        "run", "KeyError: 'x'", {"sandbox": "app.py uses apptainer"}
    )
    assert cls == "sandbox" and reason.startswith("app.py uses apptainer; run failed: KeyError")
    assert sweep.classify_failure("requirements", "uv: no solution", {}) == (
        "requirements",
        "uv: no solution",
    )


def test_ordinary_log_lines_do_not_decide_the_class() -> None:
    """A port or pid that reads like an HTTP status, or "GPU" in an INFO line, is no cause."""
    log = (
        "INFO:     Started server process [10403]\n"
        "INFO:     model card says GPU recommended\n"
        "ValueError: expected a list of messages\n"
    )
    assert sweep.classify_failure("run", log, {}) == (
        "run",
        "ValueError: expected a list of messages",
    )
    assert sweep.classify_failure("run", "httpx.HTTPStatusError: status 401", {})[0] == "external"
    relayed = (
        'agent_error: HTTP 500: "Hit an exception in OpenCodeSandboxedAgent___x calling an inner '
        "server: b'ValueError(Sandbox provider reference not defined)'\""
    )
    assert sweep.classify_failure("run", relayed, {})[1] == (
        "agent_error: HTTP 500: \"b'ValueError(Sandbox provider reference not defined)'\""
    )
    stalled = (
        "Found ulimit of %s and failed to automatically increase with error %s.\n"
        "timeout: no complete answer from http://127.0.0.1:9/run in time"
    )
    assert sweep.classify_failure("run", stalled, {"sandbox": "needs a sandbox"}) == (
        "sandbox",
        "needs a sandbox; run failed: timeout: no complete answer from http://127.0.0.1:9/run "
        "in time",
    )


def test_a_missing_key_in_a_validation_error_is_an_external_service() -> None:
    """pydantic names the missing field on a line of its own; NLTK asks for a download."""
    message = (
        "pydantic_core._pydantic_core.ValidationError: 2 validation errors for SearchConfig\n"
        "exa_api_key\n"
        "  Field required [type=missing, input_value={}, input_type=dict]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/missing\n"
    )
    assert sweep.classify_failure("start", message, {}) == ("external", "exa_api_key")
    nltk = "LookupError:\n  Resource 'wordnet' not found.\n  >>> nltk.download('wordnet')\n"
    found = sweep.classify_failure("start", nltk, {})
    assert found == ("external", "Resource 'wordnet' not found.")
    unset = message.replace("exa_api_key", "image")
    assert sweep.classify_failure("start", unset, {}) == (
        "start",
        "pydantic_core._pydantic_core.ValidationError: 2 validation errors for SearchConfig: "
        "image not set",
    )


def test_table_counts_each_class_and_sorts_rows() -> None:
    outcomes = [
        sweep.Outcome(environment="b", outcome="start", reason="ValueError: x|y", seconds=50),
        sweep.Outcome(environment="a", outcome="runs", reason="2/2", mean_reward=0.5, seconds=70),
    ]
    text = sweep.table(outcomes, command="python benchmarks/gym_sweep.py")
    assert "2 environments in 2 min" in text
    assert "| runs | 1 |" in text and "| start fails | 1 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `a` | runs | 2/2 | 0.50 |",
        "| `b` | start fails | ValueError: x\\|y |  |",
    ]


def test_write_docs_replaces_only_between_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(f"# Title\n\n{sweep.BEGIN}\nold\n{sweep.END}\n\nafter\n")
    sweep.write_docs(doc, "new table\n")
    assert doc.read_text() == f"# Title\n\n{sweep.BEGIN}\nnew table\n{sweep.END}\n\nafter\n"
    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        sweep.write_docs(tmp_path / "bare.md", "x")


@pytest.mark.gym
def test_the_sweep_script_on_a_small_subset(gym_venv: GymVenv, tmp_path: Path) -> None:
    """An environment that runs, a config variant of another (``<dir>:<config>``), a variant
    naming example rows the wheel lacks, and a name that is no environment: each
    classified, the table written between the markers."""
    out = tmp_path / "sweep.jsonl"
    doc = tmp_path / "page.md"
    doc.write_text(f"{sweep.BEGIN}\n{sweep.END}\n")
    completed = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--environments",
            f"example_single_tool_call,equivalence_rule:lc,{NO_ROWS},no_such_environment",
            "--rows",
            "1",
            "--out",
            str(out),
            "--docs",
            str(doc),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = {r["environment"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert results["example_single_tool_call"]["outcome"] == "runs"
    assert results["example_single_tool_call"]["rows_scored"] == 1
    assert results["equivalence_rule:lc"]["outcome"] == "runs"
    assert results[NO_ROWS]["outcome"] == "data"
    assert "_example.jsonl, which nemo-gym does not ship" in results[NO_ROWS]["reason"]
    assert results["no_such_environment"]["outcome"] == "start"
    assert "no_such_environment" in results["no_such_environment"]["reason"]
    table = doc.read_text()
    assert "| `example_single_tool_call` | runs | 1/1 example rows scored |" in table
    assert "| runs | 2 |" in table and "| start fails | 1 |" in table
    assert "| example rows not shipped | 1 |" in table
    # the table again from the results alone, nothing started
    again = tmp_path / "again.md"
    again.write_text(f"{sweep.BEGIN}\n{sweep.END}\n")
    names = f"example_single_tool_call,equivalence_rule:lc,{NO_ROWS},no_such_environment"
    report = ["--report-only", "--environments", names, "--rows", "1", "--out", str(out)]
    subprocess.run(
        [sys.executable, str(SCRIPT), *report, "--docs", str(again)],
        check=True,
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    assert again.read_text() == table
    # --update sweeps the named ones again and keeps the rest: one line per environment
    updated = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--update", "--environments", "gymnasium,grl_tetris"),
            *("--rows", "1", "--out", str(out), "--docs", str(doc)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert updated.returncode == 0, updated.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    results = {r["environment"]: r for r in lines}
    assert len(lines) == len(results) == 6
    assert results["example_single_tool_call"]["outcome"] == "runs"
    assert results["gymnasium"]["outcome"] == "library"
    # grl_tetris parses an <action> tag: it runs only with benchmarks/gym_answers.json's rule
    assert results["grl_tetris"]["outcome"] == "runs"
    assert "| not an environment (a library) | 1 |" in doc.read_text()
