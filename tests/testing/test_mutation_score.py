"""The kit's mutation score: every planted bug (``tests/testing/planted.py``) is caught by
the checks it must fail, and by no check it need not; the correct parser passes all; a
declared difference does not hide a second bug. ``docs/testing.md`` reports the score
and the table below it is checked against ``BUGS``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, settings

from nemogym_sdk.testing import CHECKS, check_all, find_failures
from tests.testing.planted import BUGS, planted
from tests.testing.profiles import QUICK

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[2]
DETECT = settings(QUICK, phases=[Phase.explicit, Phase.generate])
"""The checks' own examples (100 in CI, 10,000 under ``make fuzz``), stopping at the first
failure: no shrinking."""
OTHERS = settings(DETECT, max_examples=min(DETECT.max_examples, 20), derandomize=True)
"""The checks a bug need not fail: 20 examples each, also under ``make fuzz`` (they run
once per planted bug), the same draws every run: a check that fails on some draw of a bug
is declared in its ``also``, found once, not in CI by chance."""


def test_the_correct_parser_passes_every_check() -> None:
    """Without a planted bug the parser passes, so each failure below is its bug's doing."""
    assert check_all(planted(), settings=QUICK) == list(CHECKS)


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_planted_bug_is_caught_by_its_checks_only(bug: str) -> None:
    """Every check the bug must fail fails (as ``check_all`` runs it), and every check
    beyond those it may also fail passes: the checks are split by property."""
    expected = BUGS[bug]
    caught = find_failures(planted(bug), settings=DETECT, only=expected.caught_by)
    assert list(caught) == [c for c in CHECKS if c in expected.caught_by]
    others = [c for c in CHECKS if c not in {*expected.caught_by, *expected.also}]
    unexpected = find_failures(planted(bug), settings=OTHERS, only=others)
    assert not unexpected, {name: f.message for name, f in unexpected.items()}


def test_a_declared_logprob_difference_does_not_hide_a_logprob_shift() -> None:
    """The issue's case: a parser pads miscounted logprob lists on purpose and also
    attaches each logprob one token late. Both checks fail on their own; with the padding
    declared, the shift is still found."""
    found = {"logprobs", "logprob_count_mismatch_not_trained"}
    others = [c for c in CHECKS if c not in found]  # as in the test above: 20 draws each
    both = planted("pads_logprobs", "shifts_logprobs")
    assert set(find_failures(both, settings=DETECT, only=found)) == found
    assert not find_failures(both, settings=OTHERS, only=others)
    declared = planted(
        "pads_logprobs",
        "shifts_logprobs",
        differences={"logprob_count_mismatch_not_trained": "we pad short lists, see #12"},
    )
    assert set(find_failures(declared, settings=DETECT, only=found)) == {"logprobs"}


@pytest.mark.parametrize(
    ("bugs", "differences", "found"),
    [
        (
            ("ignores_mask_sample", "ignores_agent_error"),
            {"failures_not_trained[mask_sample]": "our environments never mask"},
            {"failures_not_trained[agent_error]"},
        ),
        (
            ("omits_num_turns", "int_reward_read_as_zero"),
            {"num_turns": "the dict has no num_turns"},
            {"reward"},
        ),
        (
            ("skips_prefix_check", "masks_last_token"),
            {"drift_rejected": "we trust the agent's history"},
            {"policy_tokens_trained", "stitching"},
        ),
    ],
    ids=["mask_sample-declared", "num_turns-declared", "drift-declared"],
)
def test_a_declared_difference_leaves_the_other_checks_finding_bugs(
    bugs: tuple[str, ...], differences: dict[str, str], found: set[str]
) -> None:
    """One known difference declared, a second bug planted: the second is found, and
    the first bug's checks are not run."""
    checks = [*BUGS[bugs[0]].caught_by, *BUGS[bugs[1]].caught_by, *BUGS[bugs[1]].also]
    parser = planted(*bugs, differences=differences)
    got = set(find_failures(parser, settings=DETECT, only=checks))
    assert set(BUGS[bugs[1]].caught_by) <= got <= found


def test_the_docs_report_the_mutation_score_and_each_bug() -> None:
    """docs/testing.md gives the score and, for every planted bug, a row naming it and
    the checks that catch it."""
    page = (ROOT / "docs" / "testing.md").read_text()
    assert f"**{len(BUGS)} of {len(BUGS)} planted bugs caught**" in page
    for name, bug in BUGS.items():
        row = f"| `{name}` | {bug.does} | {', '.join(f'`{c}`' for c in bug.caught_by)} |"
        assert row in page, row
