"""The user and assistant text of a conversation: for reading, and for the listing's search.

Only what people wrote and what the model answered in words counts: tool calls and returns,
reasoning, system prompts, files and images are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal

from pydantic_ai.messages import ModelMessage, TextContent, TextPart, UserPromptPart, post_compaction_window

__all__ = ('conversation_text', 'names_text', 'searchable_text')

Role = Literal['user', 'assistant']


def _text_parts(messages: Iterable[ModelMessage]) -> Iterator[tuple[Role, str]]:
    for message in messages:
        for part in message.parts:
            if isinstance(part, TextPart):
                yield 'assistant', part.content
            elif isinstance(part, UserPromptPart):
                content = part.content
                if isinstance(content, str):
                    yield 'user', content
                    continue
                for item in content:
                    if isinstance(item, str):
                        yield 'user', item
                    elif isinstance(item, TextContent):
                        yield 'user', item.content


def conversation_text(messages: Sequence[ModelMessage]) -> str:
    """The messages' words, one `user: ...` or `assistant: ...` line per text part, in order.

    Every text entry of a multimodal prompt is a line of its own. All of `messages` is rendered,
    compacted history included; `''` when there is no text. For a stored run, pass the messages
    of its latest snapshot: `conversation_text((await store.latest_snapshot(run_id=run_id)).messages)`.
    """
    return '\n'.join(f'{role}: {text}' for role, text in _text_parts(messages))


def searchable_text(messages: Sequence[ModelMessage], metadata: Mapping[str, str] | None = None) -> str:
    """User and assistant text after the latest compaction, plus metadata values, case-folded.

    Tool calls and returns, reasoning, and history before a compaction are left out.
    """
    pieces = [text for _, text in _text_parts(post_compaction_window(messages))]
    if metadata:
        pieces.extend(metadata.values())
    return '\n'.join(pieces).casefold()


def names_text(title: str | None, subtitle: str | None, tags: Iterable[str]) -> str:
    """A conversation's name as the listing searches it, case-folded."""
    return '\n'.join(piece for piece in (title, subtitle, *tags) if piece).casefold()
