"""The catalogue of shipped environments, read from the installed NeMo Gym."""

from __future__ import annotations

import pytest

from nemogym_sdk.gym import CATALOGUE, GymVenv, describe_environment
from nemogym_sdk.gym.catalog import missing_data_files

EXPECTED = {
    # name: (agent implementation, tools offered by the example rows)
    "example_single_tool_call": ("simple_agent", ("get_weather",)),
    "example_multi_step": ("simple_agent", ("get_synonym_value", "extract_synonym_values")),
    "example_session_state_mgmt": ("simple_agent", ("increment_counter", "get_counter_value")),
    "example_tool_call_multireward": ("simple_agent", ("get_weather",)),
    "workplace_assistant": ("simple_agent", None),
    "wordle": ("gymnasium_agent", ("submit_guess", "check_word_validity", "get_game_state")),
    "blackjack": ("gymnasium_agent", ()),
    "example_multi_turn_gymnasium": ("gymnasium_agent", ()),
}


@pytest.mark.parametrize("name", CATALOGUE)
def test_describe_each_catalogued_environment(gym_venv: GymVenv, name: str) -> None:
    """Each environment has one agent of the expected kind, its tools and example rows."""
    info = describe_environment(gym_venv, name)
    impl, tools = EXPECTED[name]
    assert info.agent_impls == (impl,)
    assert len(info.resources_servers) == 1
    if tools is not None:
        assert info.tools == tools
    assert info.num_examples == 5
    assert info.example_path.is_file()
    assert info.description


def test_workplace_assistant_offers_27_tools(gym_venv: GymVenv) -> None:
    """workplace_assistant rows offer its 27 office tools; its agent stops after 6 steps."""
    info = describe_environment(gym_venv, "workplace_assistant")
    assert len(info.tools) == 27
    assert "email_send_email" in info.tools
    assert info.max_steps == (6,)


def test_wordle_gets_a_stand_in_word_list_only_when_missing(gym_venv: GymVenv) -> None:
    """The wheel lacks wordle's guesses.txt; the stand-in holds every shipped target."""
    files = missing_data_files(gym_venv, "wordle")
    shipped = gym_venv.resources_server_dir("wordle") / "data" / "guesses.txt"
    if shipped.is_file():
        assert files == {}
        return
    words = set(files["data/guesses.txt"].split("\n"))
    info = describe_environment(gym_venv, "wordle")
    assert "custom_target" in info.row_keys
    assert {"chump", "booby", "bogey", "ovate", "virus"} <= words
    assert missing_data_files(gym_venv, "blackjack") == {}
