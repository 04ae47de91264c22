"""The reference trainer's fault handling without servers: stop signals, the failure bound,
a sampler that does not answer, an output directory that cannot be written."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections import Counter
from pathlib import Path

import attrs
import pytest

from nemogym_sdk import Rollout, RolloutStatus, ServerDirectory
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.processes import free_loopback_ports
from nemogym_sdk.train.failures import FAILURES_FILE, check_step
from nemogym_sdk.train.faults import (
    Interrupted,
    RunStoppedError,
    StopSignals,
    check_out,
    check_rollouts,
    writing,
)
from nemogym_sdk.train.play import Played


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_at_once_outside_a_deferred_block(signum: int) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(Interrupted) as info, StopSignals():
        os.kill(os.getpid(), signum)
        signal.sigtimedwait([], 0)  # let the handler run
    assert info.value.signum == signum and info.value.exit_status == 128 + signum
    assert isinstance(info.value, KeyboardInterrupt)  # no `except Exception` swallows it
    assert signal.getsignal(signum) is before  # the previous handler is back


def test_a_signal_while_a_step_learns_lets_it_finish(capsys: pytest.CaptureFixture[str]) -> None:
    """The first signal inside ``deferred`` waits for the block; it raises when the block
    ends, and at the next block's start."""
    finished = False
    with StopSignals() as signals:
        with pytest.raises(Interrupted), signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)
            finished = True
        assert finished and signals.received == signal.SIGTERM
        with pytest.raises(Interrupted), signals.deferred():
            pytest.fail("a stopped run starts no new step")
    assert "finishing the current step" in capsys.readouterr().err


def test_a_second_signal_abandons_the_step() -> None:
    reached = False
    with StopSignals() as signals, pytest.raises(Interrupted), signals.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)
        reached = True
    assert not reached


def test_failures_up_to_the_bound_go_on_and_past_it_stop() -> None:
    check_rollouts(3, Counter(), 16, 0.0, None)
    check_rollouts(3, Counter(agent_error=8), 16, 0.5, None)  # 50 %: not more than the bound
    with pytest.raises(RunStoppedError) as info:
        check_rollouts(3, Counter(agent_error=8, timeout=1), 16, 0.5, None)
    message = str(info.value)
    assert "9 of 16 rollouts of step 3 failed (agent_error: 8, timeout: 1)" in message
    assert "max_failure_rate=0.5" in message
    check_rollouts(3, Counter(agent_error=16), 16, 1.0, None)  # 1: never stops


def _failed(row: str, status: RolloutStatus, reason: str) -> Rollout:
    return attrs.evolve(Rollout.failed(status, 2, error=reason), row_id=row)


def test_a_steps_failures_are_written_with_their_reasons_before_the_bound_stops_it(
    tmp_path: Path,
) -> None:
    """Each failed rollout of a step becomes a line of failures.jsonl (its row, status and
    reason), written before the bound is checked; the message that stops the run names that
    file and the logs, and says NeMo Gym's are the deployment's when the trainer did not
    start it."""
    ok = attrs.evolve(_failed("r0", RolloutStatus.TIMEOUT, "x"), status=RolloutStatus.OK)
    first = [ok, _failed("r1", RolloutStatus.AGENT_ERROR, "HTTP 500 from .../run: boom")]
    check_step(0, Played(first, 0.0, {}, []), tmp_path, 0.5, None)
    second = [_failed(f"r{i}", RolloutStatus.TIMEOUT, f"no answer {i}") for i in range(2)]
    with pytest.raises(RunStoppedError) as info:
        check_step(1, Played([ok, *second], 0.0, {}, []), tmp_path, 0.5, None)
    lines = [json.loads(line) for line in (tmp_path / FAILURES_FILE).read_text().splitlines()]
    assert lines == [
        {"step": 0, "row_id": "r1", "status": "agent_error", "reason": first[1].error},
        {"step": 1, "row_id": "r0", "status": "timeout", "reason": "no answer 0"},
        {"step": 1, "row_id": "r1", "status": "timeout", "reason": "no answer 1"},
    ]
    message = str(info.value)
    assert "2 of 3 rollouts of step 1 failed (timeout: 2)" in message
    assert f"reason is in {tmp_path / FAILURES_FILE}" in message
    assert f"logs are in {tmp_path / 'logs'}/" in message
    assert "NeMo Gym's where its deployment keeps them" in message
    (tmp_path / "gym" / "logs").mkdir(parents=True)
    with pytest.raises(RunStoppedError, match=rf"NeMo Gym's in {tmp_path / 'gym' / 'logs'}/"):
        check_step(1, Played(second, 0.0, {}, []), tmp_path, 0.5, None)


def test_episodes_cut_as_stragglers_are_recorded_but_not_counted(tmp_path: Path) -> None:
    """An async step's episodes cut at the straggler bound are in failures.jsonl (their
    reason says so) but not against max_failure_rate."""
    cut = [_failed(f"r{i}", RolloutStatus.TIMEOUT, "cut as a straggler") for i in range(3)]
    check_step(4, Played(cut, 0.0, {"engine_cut_episodes": 3.0}, []), tmp_path, 0.0, None)
    lines = (tmp_path / FAILURES_FILE).read_text().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["cut as a straggler"] * 3


def test_failures_with_a_sampler_that_does_not_answer_stop_the_run() -> None:
    url = f"http://127.0.0.1:{free_loopback_ports(1)[0]}/v1"  # nothing listens there
    with pytest.raises(RunStoppedError, match=r"sampler at .* does not answer \(ConnectionError"):
        check_rollouts(5, Counter(agent_error=1), 16, 1.0, url)
    check_rollouts(5, Counter(), 16, 1.0, url)  # no failures: the sampler is not asked


def test_an_output_directory_that_cannot_be_created_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match=r"out=.*cannot be written.*--out"):
        check_out(tmp_path / "file" / "run")
    check_out(tmp_path / "run")
    assert (tmp_path / "run").is_dir() and not list((tmp_path / "run").iterdir())


def test_a_failed_write_names_what_and_the_last_good_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(RunStoppedError) as info, writing("metrics.jsonl", tmp_path / "step_2"):
        raise OSError(28, "No space left on device")
    message = str(info.value)
    assert "could not write metrics.jsonl (No space left on device)" in message
    assert f"the last good checkpoint is {tmp_path / 'step_2'}" in message
    with pytest.raises(RunStoppedError, match="no checkpoint yet"), writing("x", None):
        raise OSError(28, "No space left on device")


def test_the_trainer_refuses_an_unwritable_out_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``nemogym-train --out`` under a file: exit 2 and one line, before any model or server."""
    from nemogym_sdk.train import main

    (tmp_path / "file").write_text("")
    assert main(["--out", str(tmp_path / "file" / "run"), "--steps", "1"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("nemogym-train: out=") and "--out" in said[0]


def test_a_sampler_that_stops_answering_stops_the_run_like_a_signal() -> None:
    """The watch asks the sampler every few seconds; when it has stopped answering, the main
    thread, blocked waiting for rollouts, gets the error at once (NeMo Gym's model server
    retries a refused sampler without end, so waiting for the episodes would not end it)."""
    import threading

    from nemogym_sdk.train.faults import SamplerWatch

    url = f"http://127.0.0.1:{free_loopback_ports(1)[0]}/v1"
    blocked = threading.Event()
    signals = StopSignals()
    with (
        signals,
        SamplerWatch(url, signals, every=0.05, misses=3),
        pytest.raises(RunStoppedError, match=r"does not answer \(ConnectionError, 3 times"),
    ):
        blocked.wait(30)  # the rollouts' wait: a lock, as in AgentClient.run_sync
    assert not blocked.is_set()


def test_a_stop_while_a_step_learns_waits_for_the_step() -> None:
    error = RunStoppedError("gone")
    finished = False
    with StopSignals() as signals:
        with pytest.raises(RunStoppedError, match="gone"), signals.deferred():
            signals.stop(error)
            signal.sigtimedwait([], 0)
            finished = True
        assert finished


def test_a_frozen_server_behind_timed_out_episodes_is_named(tmp_path: Path) -> None:
    """Episodes that time out say only that the agent did not answer; the step's check then
    probes the deployment and names the server that does not answer (here one that accepts
    connections and never answers, as a SIGSTOPped process does), in each timed-out
    rollout's reason and in the message. Failures of another kind probe nothing."""
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)
    url = f"127.0.0.1:{frozen.getsockname()[1]}"
    deployment = ServerDirectory.from_urls(resources_servers={"tools": url})
    try:
        errors = [_failed("r0", RolloutStatus.AGENT_ERROR, "HTTP 422")]
        check_step(0, Played(errors, 0.0, {}, []), tmp_path, 1.0, None, [deployment])
        timed_out = [_failed(f"r{i}", RolloutStatus.TIMEOUT, "no answer") for i in range(2)]
        with pytest.raises(RunStoppedError) as info:
            check_step(1, Played(timed_out, 0.0, {}, []), tmp_path, 0.5, None, [deployment])
    finally:
        frozen.close()
    named = f"not answering at the step's end: tools (resources_servers http://{url}/: ReadTimeout)"
    lines = (tmp_path / FAILURES_FILE).read_text().splitlines()
    reasons = [json.loads(line)["reason"] for line in lines]
    assert reasons == ["HTTP 422", f"no answer; {named}", f"no answer; {named}"]
    assert named in str(info.value)
