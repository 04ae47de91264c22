"""The parser under test, as the property checks see it.

A ``Parser`` pairs the function under test (one ``/run`` result in, anything out) with an
adapter that says what that output would train on, as ``Sample`` records. Adapters for
the two common shapes ship here: ``seed_dict_samples`` (the dict of ``prompt_ids``,
``completion_ids``, ``env_mask``, ``logprobs``, ``reward``, ``num_turns`` that axolotl's
parser and ``Rollout.to_dict()`` return) and ``rollout_samples`` (``nemogym_sdk.Rollout``);
``sdk_parser()`` is this SDK's parser. A parser that returns the seed's dict needs no
adapter::

    check_all(Parser(parse=lambda response: my_parse(response, EOS), name="mine"))

``Parser.differences`` declares what the parser does differently on purpose (check name
-> why); those checks are left out and every other check still runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from nemogym_sdk import (
    DriftError,
    DriftPolicy,
    Rollout,
    RolloutStatus,
    parse_agent_response,
)
from nemogym_sdk.errors import NemoGymError

__all__ = [
    "Parser",
    "PropertyCheckError",
    "Sample",
    "rollout_samples",
    "sdk_parser",
    "seed_dict_samples",
]


@attrs.frozen(kw_only=True)
class Sample:
    """One training sample as a check sees it, whatever the parser's output shape."""

    prompt_ids: tuple[int, ...]
    """The prompt the completion is conditioned on."""
    completion_ids: tuple[int, ...]
    """Everything after the prompt: generations and the environment tokens between them."""
    train_mask: tuple[int, ...]
    """1 where the token is a policy token the loss trains, 0 for context."""
    logprobs: tuple[float, ...]
    """The sampling logprob the parser attached to each completion token."""
    reward: float
    """The reward the sample is trained with."""
    num_turns: int | None = None
    """Model turns the sample reports (the seed's ``num_turns``); ``None`` when the
    adapter does not fill it in, which ``check_num_turns`` reports as a failure."""
    trainable: bool = True
    """Whether the sample goes into the loss (and the group baseline) at all."""

    def trained(self) -> list[tuple[int, float]]:
        """``(token, logprob)`` of every trained position, in order."""
        return [
            (t, lp)
            for t, m, lp in zip(self.completion_ids, self.train_mask, self.logprobs, strict=False)
            if m == 1
        ]

    def describe(self) -> str:
        """The sample drawn with its tokens."""
        flag = "" if self.trainable else " (not trainable)"
        return (
            f"prompt_ids {list(self.prompt_ids)} completion_ids {list(self.completion_ids)} "
            f"train_mask {list(self.train_mask)} logprobs {list(self.logprobs)} "
            f"reward {self.reward!r} num_turns {self.num_turns}{flag}"
        )


def seed_dict_samples(output: Mapping[str, Any]) -> list[Sample]:
    """Adapter for the seed's dict shape (``prompt_ids``, ``completion_ids``, ``env_mask``,
    ``logprobs``, ``reward``, ``num_turns``), as axolotl's parser and ``Rollout.to_dict()``
    return it. The dict has no status, so the sample counts as trainable when any
    ``env_mask`` entry is 1."""
    mask = tuple(int(m) for m in output["env_mask"])
    turns = output.get("num_turns")
    return [
        Sample(
            prompt_ids=tuple(int(t) for t in output["prompt_ids"]),
            completion_ids=tuple(int(t) for t in output["completion_ids"]),
            train_mask=mask,
            logprobs=tuple(float(lp) for lp in output["logprobs"]),
            reward=float(output["reward"]),
            num_turns=None if turns is None else int(turns),
            trainable=any(m == 1 for m in mask),
        )
    ]


def rollout_samples(rollout: Rollout) -> list[Sample]:
    """Adapter for ``nemogym_sdk.Rollout``: the rollout and its forks; only ``OK``
    samples are trainable."""
    return [
        Sample(
            prompt_ids=tuple(sample.prompt_ids.tolist()),
            completion_ids=tuple(sample.completion_ids.tolist()),
            train_mask=tuple(sample.env_mask.tolist()),
            logprobs=tuple(sample.logprobs.tolist()),
            reward=sample.reward,
            num_turns=sample.num_turns,
            trainable=sample.status is RolloutStatus.OK,
        )
        for sample in rollout.samples()
    ]


@attrs.frozen(kw_only=True)
class Parser:
    """A parser under test: ``parse(response) -> output`` and ``samples(output)``."""

    parse: Callable[[Any], Any]
    """Takes one ``/run`` result (a dict, or raw bytes when ``takes_bytes``)."""
    samples: Callable[[Any], Iterable[Sample]] = seed_dict_samples
    """Adapter from the parser's output to the samples it would train on."""
    rejects: tuple[type[BaseException], ...] = ()
    """Exceptions the parser raises on purpose to refuse an input (e.g. ``DriftError``
    under ``DriftPolicy.RAISE``); any other exception is a crash."""
    takes_bytes: bool = False
    """Also feed raw JSON bytes (valid, truncated and noise) to ``parse``."""
    name: str = "parser"
    """How failure messages name the parser."""
    differences: Mapping[str, str] = attrs.field(factory=dict)
    """Deliberate differences from the checks: check name (a name of ``CHECKS``, or a
    family such as ``"failures_not_trained"``) -> why. Those checks are not run for this
    parser; every other check still is, so a new bug is still found."""


def sdk_parser(on_drift: DriftPolicy | str = DriftPolicy.MARK, *, eos_token_id: int = 2) -> Parser:
    """``nemogym_sdk.parse_agent_response`` under ``on_drift`` as a ``Parser`` (fed dicts
    and raw bytes; ``DriftError`` is its declared rejection under ``RAISE``)."""
    policy = DriftPolicy(on_drift)

    def parse(response: Any) -> Rollout:
        return parse_agent_response(response, eos_token_id, on_drift=policy)

    return Parser(
        parse=parse,
        samples=rollout_samples,
        rejects=(DriftError,) if policy is DriftPolicy.RAISE else (),
        takes_bytes=True,
        name=f"parse_agent_response (on_drift={policy.value})",
    )


class PropertyCheckError(NemoGymError, AssertionError):
    """A property check failed; ``counterexample`` is the shrunk input that breaks it."""

    def __init__(self, check: str, parser: str, message: str, counterexample: Any) -> None:
        super().__init__(f"{check} failed for {parser}: {message}")
        self.check = check
        """The check's name (a key of ``CHECKS``)."""
        self.parser = parser
        """``Parser.name``."""
        self.message = message
        """What broke, with the input drawn (tokens, or the JSON that crashed the parser)."""
        self.counterexample = counterexample
        """The shrunk input: an ``Episode``, a ``FailureCase``, a JSON value or bytes."""
