"""The synchronous HTTP edge: ``requests``' exceptions become the SDK's, in one place."""

from __future__ import annotations

import socket

import pytest
import requests

from nemogym_sdk import DeadlineError, ServerError, TransportError
from nemogym_sdk._net.http import check, owned_session, send
from nemogym_sdk.processes import free_loopback_ports
from tests.fakes import head_server


def test_refused_and_silent_servers_are_sdk_errors() -> None:
    with requests.Session() as http:
        with pytest.raises(TransportError, match="cannot reach") as refused:
            send(
                http,
                "GET",
                f"http://127.0.0.1:{free_loopback_ports(1)[0]}/",
                timeout=2,
                hint="Start it.",
            )
        assert isinstance(refused.value.__cause__, requests.ConnectionError)
        assert "Start it." in str(refused.value)
        with socket.socket() as silent:  # accepts the connection, never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            port = silent.getsockname()[1]
            with pytest.raises(DeadlineError, match=r"no answer within 0\.3 s"):
                send(http, "GET", f"http://127.0.0.1:{port}/", timeout=0.3)


def test_an_error_status_is_a_server_error_with_the_servers_message() -> None:
    with head_server({}, [], ready=False) as head, requests.Session() as http:
        response = send(http, "GET", f"{head.url}/readyz", timeout=5)
        with pytest.raises(ServerError, match="answered HTTP 503") as failed:
            check(response, "the head")
        assert failed.value.status == 503
        ok = send(http, "GET", f"{head.url}/server_instances", timeout=5)
        assert check(ok, "the head") is ok


def test_owned_sessions_are_closed_and_given_ones_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[requests.Session] = []

    class Recording(requests.Session):
        def close(self) -> None:
            closed.append(self)
            super().close()

    monkeypatch.setattr("nemogym_sdk._net.http.requests.Session", Recording)
    given = Recording()
    with owned_session(given) as http:
        assert http is given
    assert closed == []
    with owned_session() as mine:
        assert isinstance(mine, Recording)
    assert closed == [mine]
