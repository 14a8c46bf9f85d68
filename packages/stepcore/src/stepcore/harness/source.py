"""What reading a pydantic-ai-harness store gives: its runs, one at a time, in stepcore's records."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from stepcore.harness.markers import HARNESS_MARKER_PREFIX, restore_harness_media
from stepcore.media.protocol import digest_of_uri
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = ('HarnessRun', 'HarnessSource', 'decode_history')

logger = logging.getLogger('stepcore.harness')

T = TypeVar('T')


@dataclass(kw_only=True)
class HarnessRun:
    """Everything a harness store holds for one run, as stepcore records.

    `record` is `None` for a run whose events, snapshots or ledger entries were written without a
    run record (the harness allows that). `skipped` names each record that could not be read;
    it is left out, with a warning on the `stepcore.harness` logger.
    """

    run_id: str
    record: RunRecord | None = None
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    snapshots: list[ContinuableSnapshot] = field(default_factory=list[ContinuableSnapshot])
    tool_effects: list[ToolEffectRecord] = field(default_factory=list[ToolEffectRecord])
    media: set[str] = field(default_factory=set[str])
    """Digests of the externalized payloads put back into the snapshots."""
    skipped: list[str] = field(default_factory=list[str])

    def read(self, what: str, reader: Callable[[], T]) -> T | None:
        """`reader()`, or `None` after noting `what` as skipped when it raises (a damaged record)."""
        try:
            return reader()
        except Exception as error:  # a record of any shape can be damaged in any way
            reason = (
                f'{what} of run {self.run_id!r} cannot be read, so it is not imported: {type(error).__name__}: {error}'
            )
            logger.warning('%s', reason)
            self.skipped.append(reason)
            return None


class HarnessSource(ABC):
    """A pydantic-ai-harness store opened for reading (its SQLite database or its folder of files)."""

    @abstractmethod
    def describe(self) -> str:
        """Where the store is, for messages."""

    @abstractmethod
    def run_ids(self) -> list[str]:
        """Every run id, runs with a record first (oldest `started_at` first), then those without one."""

    @abstractmethod
    def read_run(self, run_id: str) -> HarnessRun:
        """One run's records; a damaged one is left out and named in `HarnessRun.skipped`."""

    def runs(self) -> Iterator[HarnessRun]:
        """`read_run` for each of `run_ids`."""
        for run_id in self.run_ids():
            yield self.read_run(run_id)

    @abstractmethod
    def close(self) -> None:
        """Release what the source opened."""

    def __enter__(self) -> HarnessSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_history(stored: str | list[Any], blob: Callable[[str], bytes], media: set[str]) -> list[ModelMessage]:
    """A stored harness history (its JSON text or parsed list) as messages, with externalized media put back.

    `blob(digest)` returns the bytes stored under a sha256 digest; each digest used is added to `media`.
    """
    text = stored if isinstance(stored, str) else None
    if text is not None and HARNESS_MARKER_PREFIX not in text:
        return ModelMessagesTypeAdapter.validate_json(text)
    value: Any = json.loads(text) if text is not None else stored

    def by_uri(uri: str) -> bytes:
        digest = digest_of_uri(uri)
        media.add(digest)
        return blob(digest)

    return ModelMessagesTypeAdapter.validate_python(restore_harness_media(value, by_uri))
