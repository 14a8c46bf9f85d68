"""What a conversation head is made of: its summary, its messages, and the conflict a stale writer gets.

`ConversationSummary` carries our field names and, for code written against pydantic-ai-harness,
that library's names too: `id` for `conversation_id`, `owner_pid` for `writer_pid`,
`naming_version` for `name_revision` and `named_revision` for `named_at_revision`. Either name
is accepted when a summary is built or validated, and both read back. That library's summaries are
dataclasses, so code written for it copies them with `dataclasses.replace`: ours answer it too.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, cast
from uuid import uuid4

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_ai.messages import ModelMessage

__all__ = (
    'ConversationConflict',
    'ConversationSummary',
    'GitCheckout',
    'Outcome',
    'SavedConversation',
    'TitleSource',
)

TitleSource = Literal['generated', 'manual']
"""Who named a conversation: a naming model, or a person (`None` while it has no name)."""

Outcome = Literal['ready', 'running', 'completed', 'failed', 'cancelled']
"""Where a conversation's latest run stands, as the application reports it when it saves.

`'running'` together with an owner process id is what `ensure_inactive` checks.
"""

_TITLE_SOURCE_SPELLINGS: dict[str, TitleSource | None] = {'user': 'manual', 'fallback': None}
"""pydantic-ai-harness spells a person's title `'user'` and the unnamed state `'fallback'`."""

_SPELLINGS = (
    ('conversation_id', 'id'),
    ('writer_pid', 'owner_pid'),
    ('name_revision', 'naming_version'),
    ('named_at_revision', 'named_revision'),
)
"""Our field names and pydantic-ai-harness's names for the same fields."""


class ConversationConflict(ValueError):
    """A save, name, delete or take-over that the stored conversation refuses.

    Raised when the write was based on a revision that is no longer current, when the
    conversation was deleted, or when it is running in another live process on this machine.
    Read the conversation again before writing.
    """

    def __init__(self, conversation_id: str, message: str) -> None:
        super().__init__(f'conversation {conversation_id!r}: {message}')
        self.conversation_id = conversation_id


class GitCheckout(BaseModel):
    """The Git checkout a conversation's workspace was in, so it can be grouped after the folder is gone."""

    model_config = ConfigDict(frozen=True)

    repository: str
    """The repository's common Git directory (the same for all of its worktrees)."""
    name: str
    """The repository's display name."""
    root: str
    """The checkout's top-level folder."""
    branch: str = ''
    """The checked-out branch, or a label for a detached checkout."""


def _new_id() -> str:
    return str(uuid4())


class ConversationSummary(BaseModel):
    """What a listing shows of a conversation, and the revisions a writer bases its next write on.

    Content (`save`), names (`name`) and archiving (`set_archived`) move independently: naming and
    archiving change neither `revision` nor `updated_at`.
    """

    schema_version: Literal[1] = 1
    """Version of the summary's layout; a summary of an unknown version is refused."""
    conversation_id: str = Field(default_factory=_new_id, validation_alias=AliasChoices('conversation_id', 'id'))
    """The conversation's id (also `id`); a new summary gets a random UUID when none is given."""
    workspace: str = ''
    """The folder the conversation worked in, as the application records it ('' when none)."""
    checkout: GitCheckout | None = None
    """The Git checkout `workspace` was in when saved, when the application records one."""
    revision: int = 0
    """Content revision; 0 for a conversation that has never been saved."""
    name_revision: int = Field(default=0, validation_alias=AliasChoices('name_revision', 'naming_version'))
    """Revision of the name (title, subtitle, tags), separate from content (also `naming_version`)."""
    named_at_revision: int | None = Field(
        default=None, validation_alias=AliasChoices('named_at_revision', 'named_revision')
    )
    """Content revision the current name was made for (`named_revision` reads it as 0 when unnamed)."""
    title: str | None = None
    subtitle: str | None = None
    tags: list[str] = Field(default_factory=list[str])
    title_source: TitleSource | None = None
    """`'manual'` for a title a person set (harness spelling `'user'`), `None` while unnamed."""
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    """Application values, searched by `listing(query=...)`."""
    model: str | None = None
    """The model the conversation runs on, as the application records it."""
    outcome: Outcome = 'ready'
    run_id: str | None = None
    """The step-persistence run the conversation's latest turn ran as, when the application records it."""
    writer_pid: int | None = Field(default=None, validation_alias=AliasChoices('writer_pid', 'owner_pid'))
    """Process id of the local process that owns the conversation while it runs (also `owner_pid`)."""
    busy: bool = False
    """When read: `outcome` is `'running'` and the owner process was alive on this machine."""
    message_count: int = 0
    total_tokens: int = 0
    """Tokens the saved model responses report having used."""
    naming_tokens: int = 0
    """Tokens spent naming the conversation, kept apart from `total_tokens`."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    """Last content change (naming and archiving do not move it)."""
    archived_at: datetime | None = None
    """When the conversation was archived; `listing(archived=False)` leaves it out. A content save clears it."""

    if TYPE_CHECKING:
        # What type checkers see; at run time pydantic's constructor takes each field by either spelling.
        def __init__(
            self,
            *,
            schema_version: Literal[1] = ...,
            conversation_id: str = ...,
            id: str = ...,
            workspace: str = ...,
            checkout: GitCheckout | None = ...,
            revision: int = ...,
            name_revision: int = ...,
            naming_version: int = ...,
            named_at_revision: int | None = ...,
            named_revision: int | None = ...,
            title: str | None = ...,
            subtitle: str | None = ...,
            tags: list[str] | tuple[str, ...] = ...,
            title_source: TitleSource | Literal['user', 'fallback'] | None = ...,
            metadata: dict[str, str] = ...,
            model: str | None = ...,
            outcome: Outcome = ...,
            run_id: str | None = ...,
            writer_pid: int | None = ...,
            owner_pid: int | None = ...,
            busy: bool = ...,
            message_count: int = ...,
            total_tokens: int = ...,
            naming_tokens: int = ...,
            created_at: datetime | None = ...,
            updated_at: datetime | None = ...,
            archived_at: datetime | None = ...,
        ) -> None:
            """Build a summary; each field may be given by our name or by its pydantic-ai-harness name."""

    @model_validator(mode='before')
    @classmethod
    def _one_value_per_field(cls, data: object) -> object:
        if isinstance(data, dict):
            given = cast(dict[str, object], data)
            for ours, theirs in _SPELLINGS:
                if ours in given and theirs in given and given[ours] != given[theirs]:
                    raise ValueError(
                        f'{ours}={given[ours]!r} and {theirs}={given[theirs]!r} name the same field with different '
                        'values: pass only one of them'
                    )
        return data

    @field_validator('title_source', mode='before')
    @classmethod
    def _harness_title_source(cls, value: object) -> object:
        if isinstance(value, str) and value in _TITLE_SOURCE_SPELLINGS:
            return _TITLE_SOURCE_SPELLINGS[value]
        return value

    @property
    def id(self) -> str:
        """The conversation's id (`conversation_id`)."""
        return self.conversation_id

    @property
    def owner_pid(self) -> int | None:
        """Process id of the owning local process (`writer_pid`)."""
        return self.writer_pid

    @property
    def naming_version(self) -> int:
        """Revision of the name (`name_revision`)."""
        return self.name_revision

    @property
    def named_revision(self) -> int:
        """Content revision the current name was made for; 0 while the conversation has no name."""
        return self.named_at_revision or 0


class SavedConversation(BaseModel):
    """A conversation head with its messages."""

    summary: ConversationSummary
    messages: list[ModelMessage]


def _copied_by_dataclasses_replace(model: type[BaseModel]) -> None:
    """Let `dataclasses.replace(summary, outcome=...)` copy `model` as it copies a dataclass.

    `replace` reads the fields a class lists in `__dataclass_fields__`, takes each one not given from
    the instance, and builds a new instance from them: here pydantic's constructor, so the copy is
    validated like any summary. A field pydantic-ai-harness spells otherwise is listed by its name
    (`owner_pid`, not `writer_pid`), the name code written for that library passes to `replace`; a
    field listed twice would reach the constructor with two values. `named_at_revision` keeps its
    name: the other spelling reads an unnamed conversation's `None` as 0. The list is the one
    `make_dataclass` writes, so `dataclasses.fields` and `asdict` answer it too.
    """
    theirs = {ours: other for ours, other in _SPELLINGS if ours != 'named_at_revision'}
    names = [theirs.get(name, name) for name in model.model_fields]
    listing = dataclasses.make_dataclass(
        model.__name__, [(name, Any, dataclasses.field(default=None)) for name in names], kw_only=True
    )
    setattr(model, '__dataclass_fields__', listing.__dataclass_fields__)  # noqa: B010 - a dunder pyright would refuse


for _model in (GitCheckout, ConversationSummary, SavedConversation):
    _copied_by_dataclasses_replace(_model)
