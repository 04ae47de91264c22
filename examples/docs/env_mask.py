"""Draw the env mask of a 3-turn episode from a real parse and collate.

The episode is a NeMo Gym ``/run`` result cut to what the parser reads, with tiny integer
tokens: a 3-token prompt, three model turns, tool output between them. A one-turn episode
joins it in the batch to show the padding.
"""

from nemogym_sdk import collate, parse_agent_response

EOS, PAD = 2, 0


def model_turn(prompt: list[int], generation: list[int]) -> dict[str, object]:
    """The last output item of one model call, with the token ids NeMo Gym attaches."""
    return {
        "type": "function_call",
        "name": "move",
        "arguments": "{}",
        "call_id": "c1",
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }


tool_output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
three_turns = {
    "response": {
        "output": [
            model_turn([1, 3, 4], [10, 11, 12]),
            tool_output,
            model_turn([1, 3, 4, 10, 11, 12, 50, 51], [20]),
            tool_output,
            model_turn([1, 3, 4, 10, 11, 12, 50, 51, 20, 60, 61, 62], [30, 31]),
        ]
    },
    "reward": 1.0,
}
one_turn = {"response": {"output": [model_turn([1, 5], [40, 41])]}, "reward": 0.0}
rollout = parse_agent_response(three_turns, eos_token_id=EOS, row_id="a")
batch = collate(
    [rollout, parse_agent_response(one_turn, eos_token_id=EOS, row_id="b")], pad_token_id=PAD
)

# 1. The rollout, one column per token, cut into segments where env_mask changes.
segments = [("prompt", [(t, "", "") for t in rollout.prompt_ids.tolist()])]
turns = 0
for token, mask, logprob in zip(
    rollout.completion_ids.tolist(),
    rollout.env_mask.tolist(),
    rollout.logprobs.tolist(),
    strict=True,
):
    if len(segments) == 1 or segments[-1][1][-1][1] != mask:
        turns += mask
        segments.append((f"gen {turns}" if mask else "tool out", []))
    segments[-1][1].append((token, mask, f"{logprob:.1f}"))
for row, name in enumerate(["", "token", "env_mask", "logprob"]):
    cells = [
        label if row == 0 else "".join(f"{column[row - 1]!s:<5}" for column in columns)
        for label, columns in segments
    ]
    widths = [max(len(label), 5 * len(columns)) for label, columns in segments]
    print(
        f"{name:9}" + " | ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()
    )
print()

# 2. The batch: prompts left-padded, completions right-padded, then the masks.
for name in ("prompt_ids", "completion_ids", "completion_mask", "env_mask", "loss_mask"):
    print(f"{name:16}" + "   ".join(str(row) for row in getattr(batch, name).tolist()))
