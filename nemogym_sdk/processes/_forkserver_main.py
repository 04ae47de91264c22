"""Fork-server entry point, run by a venv's interpreter: ``python -u _forkserver_main.py
<module> ...``. Not imported by nemogym_sdk (it may run under another Python).

It imports the modules it is given once (NeMo Gym's server bases take ~2.5 s of CPU to
import, at every server start otherwise), then reads one JSON request per line on stdin::

    {"argv": [python, ["-P"], script, *args], "cwd": ..., "env": {...}, "log": path,
     "err": path (optional), "ignore": [signals the owner ignores] (optional)}

(or ``[python, "-m", module, *args]``) and forks a child that runs ``script`` (or
``module``) as ``__main__``, as ``python [-P] script args`` (``python -m module args``)
would: a session of its own, stdin from /dev/null, stdout appended to ``log`` and stderr
to ``err`` (``log`` without it), ``cwd`` its directory, ``env`` its whole environment
(``PYTHONPATH`` put on ``sys.path``), the signal handlers a new interpreter started by the
owner starts with.
It answers ``{"pid": n}`` (or ``{"error": ...}``) once the child leads its session, and
``{"exit": pid, "code": c}`` when a child ends (``c`` as ``subprocess`` reports it:
negative for a signal). When its stdin closes it forks no more, and exits once every child
has ended (their owner, or its watchdog, stops them); it never signals them itself.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib
import importlib.machinery
import io
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
import types
from typing import Any

_BASE_PATH = list(sys.path[1:])  # sys.path[0] is this file's directory


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _run_main(script: str) -> None:
    """Run ``script`` as the ``__main__`` module, as the interpreter runs a script."""
    with io.open_code(script) as source:
        code = compile(source.read(), script, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=script,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", script),
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _child(request: dict[str, Any]) -> int:
    """In the forked child: become ``python [-P] script args`` (``python -m module args``)
    and run it; its exit code."""
    os.setsid()
    # What a new interpreter started by the owner would have: the signals the owner ignores
    # stay ignored (exec keeps SIG_IGN); otherwise Ctrl-C raises KeyboardInterrupt and the
    # rest default. A closed pipe raises BrokenPipeError (SIGPIPE ignored, as here).
    ignored = set(request.get("ignore", ()))
    for sig in (*request.get("reset", ()), signal.SIGCHLD):
        if sig in ignored:
            signal.signal(sig, signal.SIG_IGN)
        elif sig == signal.SIGINT:
            signal.signal(sig, signal.default_int_handler)
        else:
            signal.signal(sig, signal.SIG_DFL)
    argv = list(request["argv"][1:])
    module = argv[1] if argv[0] == "-m" else None
    safe_path = argv[0] == "-P"
    if module is not None:
        argv = ["-m", *argv[2:]]  # sys.argv[0] becomes the module's file, as with -m
    elif safe_path:
        argv = argv[1:]
    null = os.open(os.devnull, os.O_RDONLY)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    log = os.open(request["log"], flags, 0o644)
    err = os.open(request["err"], flags, 0o644) if request.get("err") else log
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(err, 2)
    for fd in {null, log, err}:
        os.close(fd)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    script = os.path.abspath(argv[0]) if module is None else ""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.path.dirname(script) if module is None else os.getcwd()
    sys.path[:] = ([] if safe_path else [first]) + extra + _BASE_PATH
    sys.argv = argv  # argv[0] as given, as the interpreter leaves it
    if "numpy" in sys.modules:  # each child draws its own numbers, as a new process would
        sys.modules["numpy"].random.seed()
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _run_main(script)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 -- as the interpreter would: a traceback, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def _fork(request: dict[str, Any]) -> None:
    try:
        pid = os.fork()
    except OSError as exc:
        _reply({"error": f"fork failed: {exc}"})
        return
    if pid == 0:  # the child
        code = 1
        try:
            code = _child(request)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # a closed log: nothing left to say
                    stream.flush()
            os._exit(code)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # answer once it leads its session: stoppable
        try:
            if os.getpgid(pid) == pid:
                break
        except ProcessLookupError:
            break
        time.sleep(0.001)
    _reply({"pid": pid})


def _reap(block: bool = False) -> bool:
    """Report every child that has ended; False once no child is left."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        with contextlib.suppress(OSError):  # the owner may be gone: reap all the same
            _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def main(modules: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the owner
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 -- a child imports what it lacks itself
            print(f"fork server: not preloaded: {name}: {exc!r}", file=sys.stderr)
    _reply({"ready": os.getpid()})
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        _reap()
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:  # the owner closed us or died: reap the children left, then go
            while _reap(block=True):
                pass
            sys.stdout.flush()
            os._exit(0)  # no interpreter finalisation: seconds with NeMo Gym imported
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            _fork(json.loads(line))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
