"""A stored history as a readable transcript: each message with its parts (prompts, tool calls with their
arguments, returns, text), every stored string shown as text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, cast

from pydantic_ai.messages import (
    BinaryContent,
    FileUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepcore.cli.cells import clip

__all__ = ('render_messages',)


def _args_text(part: ToolCallPart) -> str:
    args = part.args
    if args is None:
        return '{}'
    if isinstance(args, str):
        try:
            return json.dumps(json.loads(args), ensure_ascii=False)
        except ValueError:
            return args
    return json.dumps(args, ensure_ascii=False, default=str)


def _size(n: int) -> str:
    return f'{n} bytes' if n < 1024 else f'{n / 1024:.1f} KiB'


def _item_text(item: object) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, BinaryContent):
        binary: Any = item  # a pydantic dataclass, which type checkers see only as such
        return f'[{binary.media_type}, {_size(len(binary.data))}]'
    if isinstance(item, FileUrl):
        link: Any = item
        return f'[{link.url}]'
    return f'<{type(item).__name__}>'


def _content_text(content: Any) -> str:
    if isinstance(content, str | BinaryContent | FileUrl):
        return _item_text(content)
    if isinstance(content, Iterable) and not isinstance(content, bytes | dict):
        items = cast(Iterable[object], content)
        return ' '.join(_item_text(item) for item in items)
    value = cast(object, content)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _grid() -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=1)
    grid.add_column(no_wrap=True, min_width=11)
    grid.add_column(overflow='fold', ratio=1)
    return grid


def _row(grid: Table, label: str, style: str, body: str) -> None:
    grid.add_row('', Text(label, style=style), Text(clip(body, 400)))


def render_messages(messages: Sequence[ModelMessage]) -> Group:
    """Each message with its parts: prompts, tool calls with their arguments, returns and text."""
    blocks: list[RenderableType] = []
    for index, message in enumerate(messages):
        grid = _grid()
        if isinstance(message, ModelRequest):
            blocks.append(Text(f'[{index}] request', style='bold cyan'))
            if message.instructions:
                _row(grid, 'instructions', 'dim', message.instructions)
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    _row(grid, 'system', 'dim', part.content)
                elif isinstance(part, UserPromptPart):
                    _row(grid, 'user', 'bold', _content_text(part.content))
                elif isinstance(part, ToolReturnPart):
                    body = f'{part.tool_name} ({part.tool_call_id}) -> {_content_text(part.content)}'
                    _row(grid, 'tool return', 'green', body)
                elif part.part_kind in ('retry-prompt', 'retry-feedback'):
                    _row(grid, 'retry', 'yellow', _content_text(getattr(part, 'content', '')))
                else:
                    _row(grid, part.part_kind, 'dim', _content_text(getattr(part, 'content', '')))
        else:
            assert isinstance(message, ModelResponse)
            model = f' ({message.model_name})' if message.model_name else ''
            blocks.append(Text(f'[{index}] response{model}', style='bold magenta'))
            for part in message.parts:
                if isinstance(part, TextPart):
                    _row(grid, 'text', '', part.content)
                elif isinstance(part, ToolCallPart):
                    body = f'{part.tool_name}({_args_text(part)})  id={part.tool_call_id}'
                    _row(grid, 'tool call', 'blue', body)
                elif isinstance(part, ThinkingPart):
                    _row(grid, 'thinking', 'dim', part.content)
                else:
                    _row(grid, part.part_kind, 'dim', _content_text(getattr(part, 'content', '')))
        if grid.row_count:
            blocks.append(grid)
    if not blocks:
        blocks.append(Text('  (no messages)', style='dim'))
    return Group(*blocks)
