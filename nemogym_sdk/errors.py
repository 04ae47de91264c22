"""One exception tree for nemogym_sdk.

Every error the library raises on purpose is a ``NemoGymError``. Each leaf also
subclasses the builtin it refines, so callers that already catch ``ValueError``,
``TimeoutError`` or ``ConnectionError`` keep working. The whole tree, with the module
that defines each class outside this one (a test checks that this drawing lists every
``NemoGymError`` subclass of the package, under its real parent)::

    NemoGymError
    ├── ConfigError(ValueError)                bad arguments or configuration
    │   ├── GymVenvNotFoundError               gym.errors: no NeMo Gym venv
    │   ├── UvNotFoundError                    gym.errors: no uv to build server venvs
    │   ├── DatasetMissingError                gym.errors: a config's example rows are missing
    │   ├── ServerDirectoryMissingError        gym.errors: a config's server directory is missing
    │   ├── VllmVenvNotFoundError              samplers.vllm: no vLLM venv
    │   ├── RouterNotFoundError                samplers.router: no vllm-router executable
    │   └── EngineStalledError                 rollout_engine.groups: pacing can never fill a step
    ├── DataError(ValueError)                  malformed data from a file or a server
    │   ├── RowError                           a bad JSONL line (file and line number attached)
    │   └── DriftError                         a prompt does not extend the history (raise policy)
    ├── DiscoveryError(LookupError)            a server or agent cannot be found
    │   └── UnknownAgentError(KeyError)        a row names an agent that is not deployed
    ├── TransportError(ConnectionError)        connection refused, reset, DNS ...
    ├── ServerError                            the server answered with an error status
    │   └── LoraSyncError                      an adapter load/unload was refused or not applied
    ├── DeadlineError(TimeoutError)            a connect, request or total deadline passed
    │   └── NotReadyError                      servers did not become ready in time
    │       └── ServerNotReadyError            processes.errors: one local server, with its log
    ├── UsageError(RuntimeError)               a call out of order: start twice, use before start
    │   └── EngineClosedError                  rollout_engine.groups: a step of a closed engine
    ├── RunStoppedError(RuntimeError)          train.faults: nemogym-train stopped the run
    ├── ServerStartError(RuntimeError)         processes.errors: a local server exited at start-up
    │   ├── RequirementsInstallError           gym.errors: its requirements failed to install
    │   └── ForkServerError                    processes.forkserver: no fork server to fork it
    ├── ServeError                             serve.errors: answered as an OpenAI error body
    │   ├── BadRequestError(ValueError)        serve.errors: HTTP 400
    │   │   └── SpliceError                    serve.chat: token ids cannot be spliced
    │   ├── LogprobsModeMismatchError(ValueError)  serve.proxy_routes: vLLM's logprob mode differs
    │   ├── NotFoundError(LookupError)         serve.errors: HTTP 404
    │   ├── EpisodeAbandonedError              serve.episodes: HTTP 409, the client gave it up
    │   ├── UpstreamError                      serve.errors: vLLM answered an error
    │   ├── BadGatewayError                    serve.errors: HTTP 502
    │   ├── UpstreamUnavailableError(ConnectionError)  serve.errors: HTTP 503
    │   └── UpstreamTimeoutError(TimeoutError)         serve.errors: HTTP 504
    ├── UnsupportedTRLError(ImportError)       adapters.trl: TRL outside the supported range
    └── PropertyCheckError(AssertionError)     testing: a parser failed a property check

Foreign exceptions (aiohttp, requests) are translated at one edge each, with
``raise ... from exc``: ``nemogym_sdk._net.aio.post`` for aiohttp and
``nemogym_sdk._net.http.send`` for requests. Exceptions keep their context in plain
attributes that survive pickling, because rollouts and their errors cross process
boundaries.

Every error carries a note, printed under its message in a traceback, naming its entry in
the documentation's troubleshooting page (what it means, how to fix it):
``NemoGymError.troubleshooting_url()``. ``str(error)`` stays the message alone.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataError",
    "DeadlineError",
    "DiscoveryError",
    "DriftError",
    "LoraSyncError",
    "NemoGymError",
    "NotReadyError",
    "RowError",
    "ServerError",
    "TransportError",
    "UnknownAgentError",
    "UsageError",
]


DOCS_URL = "https://nemogym-sdk.github.io/nemogym_sdk/"
"""The documentation site (``site_url`` in ``mkdocs.yml``). Until it is published, every page
is also in the source (a checkout, the sdist) as ``docs/<page>.md``; the package is installed
from one today, so an error's note names both."""


class NemoGymError(Exception):
    """Root of every error raised by nemogym_sdk.

    Each instance gets a note (``__notes__``, shown under the message in a traceback):
    ``See <its troubleshooting entry> (offline: docs/troubleshooting.md in the source)``.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.add_note(
            f"See {self.troubleshooting_url()} (offline: docs/troubleshooting.md in the source)"
        )

    @classmethod
    def troubleshooting_url(cls) -> str:
        """This error's entry in the troubleshooting page (a private class: its nearest
        public ancestor's)."""
        public = next(c for c in cls.__mro__ if not c.__name__.startswith("_"))
        return f"{DOCS_URL}troubleshooting/#{public.__name__.lower()}"


class ConfigError(NemoGymError, ValueError):
    """An argument or a configuration value is invalid."""


class UsageError(NemoGymError, RuntimeError):
    """A call out of order: an object started twice, used before it starts or after it
    closes. The message says which call comes first. (A bad value is a ``ConfigError``.)"""


class DataError(NemoGymError, ValueError):
    """Data read from a file or received from a server is malformed."""


class RowError(DataError):
    """A line of a NeMo Gym JSONL file could not be read as a row."""

    def __init__(self, message: str, path: str = "", line: int = 0) -> None:
        super().__init__(message, path, line)
        self.path = path
        self.line = line

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.args[0]}"


class DriftError(DataError):
    """A model turn's prompt does not start with the tokens seen so far.

    Raised only under ``DriftPolicy.RAISE``; ``report`` is the human-readable
    drift report (turn index, common-prefix length, diverging window).
    """

    def __init__(self, report: str) -> None:
        super().__init__(report)
        self.report = report


class DiscoveryError(NemoGymError, LookupError):
    """A server, agent or route could not be found."""


class UnknownAgentError(DiscoveryError, KeyError):
    """A row names an agent that is not part of the deployment."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a sentence reads better.
        return str(self.args[0]) if self.args else ""


class TransportError(NemoGymError, ConnectionError):
    """The connection to a server failed (refused, reset, closed early)."""


class ServerError(NemoGymError):
    """A server answered with an error status.

    ``status`` is the HTTP status code and ``body`` the start of the body.
    """

    def __init__(self, message: str, status: int = 0, body: str = "") -> None:
        super().__init__(message, status, body)
        self.status = status
        self.body = body

    def __str__(self) -> str:
        return str(self.args[0])


class DeadlineError(NemoGymError, TimeoutError):
    """A connect, request or total deadline passed."""


class NotReadyError(DeadlineError):
    """Servers did not become ready before the deadline."""


class LoraSyncError(ServerError):
    """The inference server refused or did not apply a LoRA adapter operation.

    ``status`` is the HTTP status (0 when the server answered success but its
    ``/v1/models`` shows that the adapter did not take effect), ``body`` the start of
    the answer, and ``server_message`` the server's own error message.
    """

    def __init__(
        self, message: str, status: int = 0, body: str = "", server_message: str = ""
    ) -> None:
        super().__init__(message, status, body)
        self.args = (message, status, body, server_message)
        self.server_message = server_message
