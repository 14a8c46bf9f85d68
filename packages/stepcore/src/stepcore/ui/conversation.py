"""A snapshot's message history as a conversation: what each message and part shows, media included.

Everything here is plain data for the templates, which escape every string. Binary media keep an
address (message, part, item) so that the page links to them and the app serves their bytes from
the snapshot it read (the store's media store restored them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from pydantic_ai.messages import (
    BinaryContent,
    CachePoint,
    FileUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextContent,
    UploadedFile,
)

__all__ = (
    'INLINE_MEDIA_TYPES',
    'TEXT_LIMIT',
    'Binary',
    'MediaItem',
    'MessageView',
    'PartView',
    'Piece',
    'message_views',
    'part_binaries',
    'signature',
)

TEXT_LIMIT = 20_000
"""Characters of one text shown on a page; the rest is cut with a note saying how much."""

INLINE_MEDIA_TYPES = {
    'image/png': 'image',
    'image/jpeg': 'image',
    'image/gif': 'image',
    'image/webp': 'image',
    'image/avif': 'image',
    'image/bmp': 'image',
    'audio/mpeg': 'audio',
    'audio/wav': 'audio',
    'audio/ogg': 'audio',
    'audio/webm': 'audio',
    'video/mp4': 'video',
    'video/webm': 'video',
}
"""Media types shown in the page itself; anything else (SVG and HTML included) is only a download."""

_LABELS = {
    'system-prompt': ('system', 'system'),
    'user-prompt': ('user', 'user'),
    'tool-return': ('tool return', 'tool-return'),
    'builtin-tool-return': ('native tool return', 'tool-return'),
    'retry-prompt': ('retry', 'retry'),
    'retry-feedback': ('retry', 'retry'),
    'text': ('text', 'text'),
    'thinking': ('thinking', 'thinking'),
    'tool-call': ('tool call', 'tool-call'),
    'builtin-tool-call': ('native tool call', 'tool-call'),
    'file': ('file', 'file'),
}


@dataclass(frozen=True, kw_only=True)
class Binary:
    """The bytes of one `BinaryContent`, as the app serves them."""

    data: bytes
    media_type: str
    identifier: str | None


def _binary_of(content: object) -> Binary:
    # BinaryContent is a pydantic dataclass, which type checkers see only as such: read it as Any.
    value: Any = content
    media_type = value.media_type if isinstance(value.media_type, str) and value.media_type else None
    identifier = getattr(value, '_identifier', None)
    return Binary(
        data=bytes(value.data),
        media_type=media_type or 'application/octet-stream',
        identifier=identifier if isinstance(identifier, str) else None,
    )


@dataclass(frozen=True, kw_only=True)
class MediaItem:
    """One binary payload, addressed within its snapshot."""

    message: int
    part: int
    item: int
    media_type: str
    size: int
    kind: str
    """`image`, `audio` or `video` when shown inline, else `file` (offered as a download)."""
    digest: str
    """sha256 of the bytes, as in the payload's `media+sha256://` address."""
    identifier: str | None = None

    @property
    def path(self) -> str:
        return f'{self.message}/{self.part}/{self.item}'


@dataclass(frozen=True, kw_only=True)
class Piece:
    """One item of a part's content: text, structured data, a binary payload or a link."""

    text: str | None = None
    data: str | None = None
    """JSON text of structured content."""
    media: MediaItem | None = None
    link: str | None = None
    note: str | None = None
    """Said after the piece, e.g. that it was cut."""


@dataclass(kw_only=True)
class PartView:
    kind: str
    """CSS class: user, system, tool-call, tool-return, retry, text, thinking, file or other."""
    label: str
    pieces: list[Piece] = field(default_factory=list[Piece])
    tool_name: str | None = None
    tool_call_id: str | None = None
    args: str | None = None
    outcome: str | None = None


@dataclass(kw_only=True)
class MessageView:
    index: int
    kind: str
    """`request` or `response`."""
    title: str
    meta: list[str] = field(default_factory=list[str])
    parts: list[PartView] = field(default_factory=list[PartView])
    interrupted: bool = False
    change: str | None = None
    """Set by the diff: `added` or `changed` against the previous snapshot."""


def _clip(text: str) -> Piece:
    if len(text) <= TEXT_LIMIT:
        return Piece(text=text)
    return Piece(text=text[:TEXT_LIMIT], note=f'cut at {TEXT_LIMIT:,} of {len(text):,} characters')


def _json_text(value: object) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _data(value: object) -> Piece:
    text = _json_text(value)
    clipped = _clip(text)
    return Piece(data=clipped.text, note=clipped.note)


class _Walk:
    """Turns one part's content into pieces, numbering binaries in the order they appear."""

    def __init__(self, message: int, part: int) -> None:
        self.message = message
        self.part = part
        self.pieces: list[Piece] = []
        self.binaries: list[Binary] = []

    def add(self, content: object) -> None:
        if content is None:
            return
        if isinstance(content, str):
            self.pieces.append(_clip(content))
        elif isinstance(content, BinaryContent):
            self._binary(_binary_of(content))
        elif isinstance(content, FileUrl):
            link: Any = content  # pydantic dataclasses, which type checkers see only as such
            self.pieces.append(Piece(link=str(link.url), note=str(link.kind)))
        elif isinstance(content, TextContent):
            self.pieces.append(_clip(content.content))
        elif isinstance(content, UploadedFile):
            uploaded: Any = content
            self.pieces.append(Piece(text=f'uploaded file {uploaded.file_id}'))
        elif isinstance(content, CachePoint):
            return
        elif isinstance(content, list | tuple):
            for item in cast(Iterable[object], content):
                self.add(item)
        else:
            self.pieces.append(_data(content))

    def _binary(self, content: Binary) -> None:
        media_type = content.media_type
        item = MediaItem(
            message=self.message,
            part=self.part,
            item=len(self.binaries),
            media_type=media_type,
            size=len(content.data),
            kind=INLINE_MEDIA_TYPES.get(media_type.split(';')[0].strip().lower(), 'file'),
            digest=hashlib.sha256(content.data).hexdigest(),
            identifier=content.identifier,
        )
        self.binaries.append(content)
        self.pieces.append(Piece(media=item))


def _walk_part(message: int, index: int, part: Any) -> tuple[PartView, list[Binary]]:
    part_kind = str(getattr(part, 'part_kind', type(part).__name__))
    label, css = _LABELS.get(part_kind, (part_kind, 'other'))
    view = PartView(kind=css, label=label)
    walk = _Walk(message, index)
    tool_name = getattr(part, 'tool_name', None)
    view.tool_name = tool_name if isinstance(tool_name, str) else None
    call_id = getattr(part, 'tool_call_id', None)
    view.tool_call_id = call_id if isinstance(call_id, str) else None
    if css == 'tool-call':
        view.args = _args_text(getattr(part, 'args', None))
    else:
        outcome = getattr(part, 'outcome', None)
        if isinstance(outcome, str) and outcome != 'success':
            view.outcome = outcome
            if outcome == 'retried':
                view.kind, view.label = 'retry', 'tool retry'
        walk.add(getattr(part, 'content', None))
    view.pieces = walk.pieces
    return view, walk.binaries


def _args_text(args: object) -> str:
    if args is None:
        return '{}'
    if isinstance(args, str):
        try:
            return _json_text(json.loads(args))
        except ValueError:
            return args
    return _json_text(args)


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime('%Y-%m-%d %H:%M:%S')


def message_views(
    messages: Sequence[ModelMessage], start: int = 0, end: int | None = None, *, first: int = 0
) -> list[MessageView]:
    """Each message of `messages[start:end]` with its parts, ready for the page, numbered by its
    position in the snapshot (`messages[0]` being its message `first`)."""
    views: list[MessageView] = []
    for index, message in enumerate(messages[start:end], first + start):
        if isinstance(message, ModelRequest):
            view = MessageView(index=index, kind='request', title='request')
            view.interrupted = getattr(message, 'state', 'complete') == 'interrupted'
            if message.instructions:
                view.parts.append(PartView(kind='system', label='instructions', pieces=[_clip(message.instructions)]))
        else:
            response: ModelResponse = message
            view = MessageView(index=index, kind='response', title='response')
            if response.model_name:
                view.meta.append(response.model_name)
            if response.finish_reason:
                view.meta.append(f'finish: {response.finish_reason}')
        stamp = _when(message.timestamp)
        if stamp:
            view.meta.append(stamp)
        for part_index, part in enumerate(message.parts):
            view.parts.append(_walk_part(index, part_index, part)[0])
        views.append(view)
    return views


def part_binaries(messages: Sequence[ModelMessage], message: int, part: int) -> list[Binary]:
    """The binary payloads of one part, numbered as `message_views` numbers them; `IndexError` if none there."""
    if not 0 <= message < len(messages):
        raise IndexError(message)
    parts = messages[message].parts
    if not 0 <= part < len(parts):
        raise IndexError(part)
    return _walk_part(message, part, parts[part])[1]


def signature(view: MessageView) -> tuple[object, ...]:
    """What a message says, for comparing snapshots: its kind and its parts' content, without timestamps.

    pydantic-ai stamps fields (timestamp, run id, instructions) onto the newest request after a
    snapshot was taken, so messages are compared by content, not identity.
    """
    parts: list[tuple[object, ...]] = []
    for part in view.parts:
        if part.label == 'instructions':
            continue
        pieces = tuple((p.text, p.data, p.link, None if p.media is None else p.media.digest) for p in part.pieces)
        parts.append((part.label, part.tool_name, part.tool_call_id, part.args, part.outcome, pieces))
    return (view.kind, tuple(parts))
