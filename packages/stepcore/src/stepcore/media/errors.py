"""What a media store raises for a blob it does not hold and for one whose bytes are damaged."""

from __future__ import annotations

from stepcore.common.damage import UNPARSABLE, DamagedRecordError

__all__ = ('DamagedMediaError', 'MediaNotFoundError')


class MediaNotFoundError(FileNotFoundError, LookupError):
    """No blob is stored at `uri`: raised by `get` and `get_metadata`.

    It is a `FileNotFoundError`, as pydantic-ai-harness's media stores raise, and a `LookupError`,
    as stepcore's always have, so code written for either catches it.
    """

    def __init__(self, uri: str, where: str) -> None:
        super().__init__(f'media not found: {uri} is not stored in {where} (it was never put there, or was removed)')
        self.uri = uri
        self.where = where


class DamagedMediaError(DamagedRecordError):
    """A stored blob whose bytes do not hash to the digest its `media+sha256://` address names.

    A `ValueError` (through `stepcore.engine.DamagedRecordError`, the step stores' damage error):
    `record` names the blob, `where` the store, `kind` is `'unparsable'` (its bytes were read but are
    not the blob's) and `uri` is its address.
    """

    def __init__(self, *, uri: str, where: str, reason: str) -> None:
        super().__init__(run_id=None, record=f'media blob {uri}', where=where, reason=reason, kind=UNPARSABLE)
        self.uri = uri
