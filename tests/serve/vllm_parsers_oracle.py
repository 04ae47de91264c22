"""vLLM's own output parsers as an oracle: run with ``.venv-vllm``'s Python.

    .venv-vllm/bin/python tests/serve/vllm_parsers_oracle.py TOKENIZER_DIR < cases.json

``cases.json`` is a list of ``{"text", "reasoning_parser", "tool_parser", "tools",
"tool_choice", "chat_template_kwargs"}`` (and ``"tokenizer"``, a directory, where a case
needs another tokenizer than ``TOKENIZER_DIR``); the answer, on stdout, is one
``{"reasoning", "content", "tool_calls": [[name, arguments], ...]}`` per case: what vLLM's
chat server gets from ``parser.parse(output.text, request, enable_auto_tools=True)`` when it
runs with ``--reasoning-parser`` and ``--enable-auto-tool-choice --tool-call-parser``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager
    from vllm.tokenizers import get_tokenizer

    tokenizers: dict[str, Any] = {}
    answers: list[dict[str, Any]] = []
    for case in json.load(sys.stdin):
        where = case.get("tokenizer") or sys.argv[1]
        if where not in tokenizers:
            tokenizers[where] = get_tokenizer(where)
        tokenizer = tokenizers[where]
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        for key in ("tools", "tool_choice", "chat_template_kwargs"):
            if case.get(key) is not None:
                body[key] = case[key]
        request = ChatCompletionRequest(**body)
        tool = case.get("tool_parser")
        parser_cls = ParserManager.get_parser(
            tool_parser_name=tool,
            reasoning_parser_name=case.get("reasoning_parser"),
            enable_auto_tools=tool is not None,
            tokenizer=tokenizer,
        )
        assert parser_cls is not None
        parser = parser_cls(
            tokenizer, request.tools, chat_template_kwargs=request.chat_template_kwargs or {}
        )
        reasoning, content, calls = parser.parse(
            case["text"], request, enable_auto_tools=tool is not None, model_output_token_ids=()
        )
        answers.append(
            {
                "reasoning": reasoning,
                "content": content,
                "tool_calls": [[c.name, c.arguments] for c in calls or []],
            }
        )
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
