"""Environment configs resolved by NeMo Gym's own parser, run in the NeMo Gym venv.

The SDK does not read NeMo Gym configs itself. :func:`resolve_each` asks
``<gym venv>/bin/python -P resolve_main.py`` (:mod:`nemogym_sdk.gym.resolve_main`), a
worker started on first use and kept while it is used, for every environment not already
cached, in one request per call, and reads what NeMo Gym's ``GlobalConfigDictParser``
made of each config as data: a :class:`ResolvedEnvironment`.
What happens in there, and the two checks deferred until the stack's own servers are
added, is described in that module.

Before asking NeMo Gym, an environment is located (:func:`~nemogym_sdk.gym.locate.
locate_environment`) and a missing config is reported with what is there instead
(the variants of a directory, close environment names).

Results are cached in this process and on disk (``$NEMOGYM_CONFIG_CACHE``, else
``$XDG_CACHE_HOME/nemogym_sdk/gym-configs``: one JSON file per resolution, so that a new
process, ``nemogym-train`` at every start, need not start the worker), keyed by the
request, the interpreter, the installed nemo-gym's parser modules and this resolver, and
used while every config file the resolution read (and every agent config it looked for) is
unchanged. Failures are never cached; a cache that cannot be written is not used.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk._cache import user_cache
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.locate import (
    EnvironmentLocation,
    GymVenv,
    environment_not_found,
    locate_environment,
)

__all__ = [
    "AgentConfig",
    "ResolvedEnvironment",
    "resolve_each",
    "resolve_environments",
]

_RESOLVE_MAIN = Path(__file__).with_name("resolve_main.py")
_PARSER_MODULES = ("__init__.py", "package_info.py", "global_config.py", "config_types.py")
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")
_MEMORY: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}
_DISK_FORMAT = 1
"""Bumped when what a cache file holds changes."""
CONFIG_CACHE_ENV_VAR = "NEMOGYM_CONFIG_CACHE"
"""Environment variable naming the directory resolutions are kept in across processes."""


@attrs.frozen(kw_only=True)
class AgentConfig:
    """An agent's own config (``responses_api_agents/<agent>/configs/<agent>.yaml``),
    resolved by NeMo Gym: what an environment without an agent can be paired with."""

    agent: str
    """The agent implementation, as ``allowed_agents`` names it."""
    resources_server: str
    """The resources server instance whose ``allowed_agents`` names it."""
    path: Path
    """The config file."""
    config: Mapping[str, Any]
    """NeMo Gym's resolution of it."""


@attrs.frozen(kw_only=True)
class ResolvedEnvironment:
    """One environment's config as NeMo Gym's parser resolves it."""

    name: str
    """The environment as asked for (``<directory>`` or ``<directory>:<config>``)."""
    location: EnvironmentLocation
    """Where it lives."""
    config: Mapping[str, Any]
    """The resolved global config: its servers, its top-level keys, NeMo Gym's defaults;
    interpolations (``${policy_base_url}``) kept, as the servers resolve them."""
    missing: tuple[str, ...]
    """Dotted paths NeMo Gym reports as unset (``???``)."""
    allowed_agents: tuple[str, ...]
    """Agent implementations its resources servers accept (``allowed_agents``), in order."""
    candidates: tuple[AgentConfig, ...]
    """For a config that starts no agent: the accepted agents that ship a config."""
    datasets: Mapping[str, Path]
    """Each ``jsonl_fpath`` of its agents and resources servers (and of the candidates) ->
    the file NeMo Gym reads for it (the file may not exist)."""
    files: tuple[Path, ...]
    """The config files the resolution read or looked for."""
    nemo_gym_version: str
    """The nemo-gym that resolved it."""


def resolve_environments(
    venv: GymVenv,
    names: Sequence[str],
    *,
    cache: bool = True,
    env_path: Sequence[str | os.PathLike[str]] | None = None,
) -> list[ResolvedEnvironment]:
    """Each environment of ``names`` resolved (one request to the NeMo Gym worker for all not
    cached); the first that cannot be is a ``ConfigError`` naming it and its config.
    ``env_path``: the environment search path (``None``: ``$NEMOGYM_ENV_PATH``; see
    :func:`~nemogym_sdk.gym.locate.locate_environment`)."""
    results = resolve_each(venv, names, cache=cache, env_path=env_path)
    for name in names:
        result = results[name]
        if isinstance(result, ConfigError):
            raise result
    return [result for result in results.values() if isinstance(result, ResolvedEnvironment)]


def resolve_each(
    venv: GymVenv,
    names: Sequence[str],
    *,
    cache: bool = True,
    env_path: Sequence[str | os.PathLike[str]] | None = None,
) -> dict[str, ResolvedEnvironment | ConfigError]:
    """Name -> its resolution, or the ``ConfigError`` saying why there is none; in the
    order given, one worker request for every name not cached (``cache=False``: all)."""
    entries: dict[str, dict[str, Any]] = {}
    results: dict[str, ResolvedEnvironment | ConfigError] = {}
    locations: dict[str, EnvironmentLocation] = {}
    for name in dict.fromkeys(names):
        try:
            locations[name] = _located(venv, name, env_path)
        except ConfigError as error:
            results[name] = error
            continue
        entries[name] = _entry(venv, locations[name])
    keys = {name: _cache_key(venv, entry) for name, entry in entries.items()}
    raw = {name: _cached(keys[name]) if cache else None for name in entries}
    pending = [entries[name] for name, found in raw.items() if found is None]
    if pending:
        answered = _run_resolver(venv, pending)
        for entry in pending:
            raw[entry["name"]] = answered[entry["name"]]
            if cache and "error" not in answered[entry["name"]]:
                _store(keys[entry["name"]], answered[entry["name"]])
    for name in dict.fromkeys(names):
        found = raw.get(name)
        if name not in results and found is not None:
            results[name] = _record(locations[name], found)
    return {name: results[name] for name in dict.fromkeys(names)}


def _located(
    venv: GymVenv, name: str, env_path: Sequence[str | os.PathLike[str]] | None
) -> EnvironmentLocation:
    """The environment's location; ``ConfigError`` saying what there is if its config is not."""
    location = locate_environment(venv, name, env_path)
    path = location.config_path
    if path.is_file():
        return location
    variants = sorted(p.stem for p in location.directory.glob("configs/*.yaml"))
    if variants:
        raise ConfigError(
            f"environment {name!r} has no config {path.name}; pick one of its configs as "
            f"'{location.directory.name}:<config>': {', '.join(variants)}"
        )
    raise environment_not_found(venv, location, env_path)


def _entry(venv: GymVenv, location: EnvironmentLocation) -> dict[str, Any]:
    """What the resolver is asked for one environment: its config, the directory's own
    config (for a variant that adjusts it), and the roots relative paths are looked up in
    (the environment's root first: the SDK's environments resolve against the SDK)."""
    own = location.directory / "configs" / f"{location.directory.name}.yaml"
    base = own if own != location.config_path and own.is_file() else None
    roots = list(dict.fromkeys([str(location.root), str(venv.site_packages)]))
    return {
        "name": location.name,
        "config": str(location.config_path),
        "base": str(base) if base is not None else None,
        "roots": roots,
    }


def _run_resolver(venv: GymVenv, entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """NeMo Gym's answers for ``entries``, from the venv's resolver worker; name -> result."""
    request = {"cwd": str(venv.site_packages), "environments": entries}
    for attempt in (1, 2):
        worker = _worker(venv)
        try:
            answer = worker.ask(request)
            break
        except _WorkerGoneError as gone:
            worker.close()
            if attempt == 2:
                raise ConfigError(
                    f"NeMo Gym's config parser ({venv.python} {_RESOLVE_MAIN.name}) ended "
                    f"without answering. Last lines of its output:\n{gone}"
                ) from None
    version = str(answer["nemo_gym_version"])
    return {item["name"]: {**item, "nemo_gym_version": version} for item in answer["results"]}


class _WorkerGoneError(Exception):
    """The worker exited (idle timeout, a crash); carries the tail of its output."""


class _Worker:
    """``resolve_main.py`` in the NeMo Gym venv, answering one JSON line per request.

    Started on first use per interpreter and reused, so NeMo Gym is imported once per
    process rather than once per stack. It ends with its stdin: at :func:`_close_workers`
    (interpreter exit), when this process dies, or by itself when idle.
    """

    def __init__(self, venv: GymVenv) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env = {k: v for k, v in env.items() if not k.startswith("NEMO_GYM_")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # never write __pycache__ into the venv
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 -- its stderr, closed in close()
        argv = [str(venv.python), "-P", str(_RESOLVE_MAIN)]
        try:
            self._process = subprocess.Popen(
                argv,
                cwd=venv.site_packages,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
            )
        except OSError as exc:
            raise ConfigError(f"cannot run NeMo Gym's config parser ({argv[0]}): {exc}") from exc

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """One request answered; :class:`_WorkerGoneError` if the worker is no longer there."""
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            try:
                stdin.write(json.dumps(request) + "\n")
                stdin.flush()
                line = stdout.readline()
            except (BrokenPipeError, OSError, ValueError):
                line = ""
        if not line:
            raise _WorkerGoneError(self._tail())
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _tail(self) -> str:
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-20:]) or "<no output>"

    def close(self) -> None:
        """End the worker (its stdin closes; killed after 5 s), by its own pid only."""
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:  # else a ResourceWarning when it is collected
            self._process.stdout.close()
        self._log.close()


_WORKERS: dict[str, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def _worker(venv: GymVenv) -> _Worker:
    """This process's worker for ``venv``'s interpreter (a new one after a fork or exit)."""
    with _WORKERS_LOCK:
        worker = _WORKERS.get(str(venv.python))
        alive = worker is not None and worker._process.poll() is None
        if worker is None or not alive or worker.owner != os.getpid():
            if worker is not None and worker.owner == os.getpid():
                worker.close()  # a worker that exited: its pipes and log are closed first
            if not _WORKERS:
                atexit.register(_close_workers)
            worker = _WORKERS[str(venv.python)] = _Worker(venv)
        return worker


def _close_workers() -> None:
    with _WORKERS_LOCK:
        workers = [w for w in _WORKERS.values() if w.owner == os.getpid()]
        _WORKERS.clear()
    for worker in workers:
        worker.close()


def _record(
    location: EnvironmentLocation, raw: Mapping[str, Any]
) -> ResolvedEnvironment | ConfigError:
    """The resolver's answer for one environment as a record, or its error."""
    if "error" in raw:
        error = raw["error"]
        return ConfigError(
            f"{location.name}: NeMo Gym's config parser refused {location.config_path}: "
            f"{error['type']}: {error['message']}"
        )
    return ResolvedEnvironment(
        name=location.name,
        location=location,
        config=raw["config"],
        missing=tuple(raw["missing"]),
        allowed_agents=tuple(raw["allowed_agents"]),
        candidates=tuple(
            AgentConfig(
                agent=c["agent"],
                resources_server=c["resources_server"],
                path=Path(c["path"]),
                config=c["config"],
            )
            for c in raw["candidates"]
        ),
        datasets={key: Path(path) for key, path in raw["datasets"].items()},
        files=tuple(Path(path) for path in raw["files"]),
        nemo_gym_version=str(raw["nemo_gym_version"]),
    )


# ----------------------------------------------------------------------------- caching


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "absent"


def _cache_key(venv: GymVenv, entry: Mapping[str, Any]) -> str:
    """What a resolution depends on besides the files it reads: the request, the
    interpreter, nemo-gym's parser modules and this resolver."""
    parser = venv.site_packages / "nemo_gym"
    stamps: dict[str, list[int] | None] = {}
    for name in _PARSER_MODULES:
        try:
            stat = (parser / name).stat()
            stamps[name] = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            stamps[name] = None
    facts = {
        "entry": entry,
        "python": str(venv.python),
        "site_packages": str(venv.site_packages),
        "parser": stamps,
        "resolver": _digest(_RESOLVE_MAIN),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def config_cache() -> Path:
    """``$NEMOGYM_CONFIG_CACHE``, else ``$XDG_CACHE_HOME/nemogym_sdk/gym-configs``."""
    return user_cache(CONFIG_CACHE_ENV_VAR, "gym-configs")


def _cached(key: str) -> dict[str, Any] | None:
    """A cached answer (this process's, else the disk's) whose files are all unchanged."""
    found = _MEMORY.get(key) or _read_disk(key)
    if found is None:
        return None
    answer, digests = found
    if any(_digest(Path(file)) != digest for file, digest in digests.items()):
        return None
    _MEMORY[key] = found
    return answer


def _store(key: str, answer: dict[str, Any]) -> None:
    _MEMORY[key] = (answer, {file: _digest(Path(file)) for file in answer["files"]})
    _write_disk(key, *_MEMORY[key])


def _read_disk(key: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    try:
        kept = json.loads((config_cache() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("format") != _DISK_FORMAT:
        return None
    answer, digests = kept.get("answer"), kept.get("digests")
    if not isinstance(answer, dict) or not isinstance(digests, dict):
        return None
    return answer, digests


def _write_disk(key: str, answer: dict[str, Any], digests: dict[str, str]) -> None:
    """Kept whole or not at all (written aside, then renamed); a cache that cannot be
    written only costs the next process a resolution."""
    kept = {"format": _DISK_FORMAT, "answer": answer, "digests": digests}
    with contextlib.suppress(OSError):
        directory = config_cache()
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=directory, prefix=f".{key}-", suffix=".tmp", delete=False
        ) as out:
            json.dump(kept, out)
        try:
            os.replace(out.name, directory / f"{key}.json")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out.name)
