"""Run id rules shared by the capability and the stores."""

from __future__ import annotations

import base64
import binascii
import re

__all__ = (
    'DERIVED_RUN_ID_PREFIX',
    'MAX_RUN_ID_LENGTH',
    'derive_run_id',
    'dotted_run_id',
    'validate_path_safe_run_id',
)

MAX_RUN_ID_LENGTH = 200
DERIVED_RUN_ID_PREFIX = 'sp-'
"""What every run id derived from an agent name starts with."""
_PATH_SAFE = re.compile(r'[A-Za-z0-9_.\-]{1,200}')


def validate_path_safe_run_id(run_id: object) -> str:
    """Return `run_id` if it can name a folder safely; `ValueError` otherwise."""
    if not isinstance(run_id, str) or not _PATH_SAFE.fullmatch(run_id) or '..' in run_id or run_id == '.':
        raise ValueError(
            f'invalid run_id: {run_id!r} is not path-safe: use 1-{MAX_RUN_ID_LENGTH} of A-Z a-z 0-9 _ . -, '
            'not "." and no ".."'
        )
    return run_id


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode('ascii').rstrip('=')


def derive_run_id(agent_name: str, context_run_id: str) -> str:
    """The id a run is stored under when the capability has an `agent_name` and no `run_id`.

    `sp-` followed by the unpadded base64url encoding of `<n>:<agent_name><context_run_id>`, where
    `<n>` is the length of the agent name in UTF-8 bytes. The length prefix makes the split between
    the two parts unambiguous, so distinct pairs never share an id, and base64url keeps it
    path-safe. pydantic-ai-harness derives the same id from the same pair, so a run keeps its key
    when either library records it. Longer than 200 characters raises `ValueError`.
    """
    name_bytes = agent_name.encode()
    run_id = DERIVED_RUN_ID_PREFIX + _b64(f'{len(name_bytes)}:{agent_name}{context_run_id}'.encode())
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise ValueError(
            f'the run id derived from agent_name={agent_name!r} and run id {context_run_id!r} is {len(run_id)} '
            f'characters: it exceeds the {MAX_RUN_ID_LENGTH}-character limit. Use a shorter agent_name or pass run_id='
        )
    return run_id


def dotted_run_id(derived: str) -> str | None:
    """The id stepcore 0.1 derived for the same agent name and run as `derived` (an `sp-` id), if it is one.

    stepcore 0.1 stored such runs as `<b64(agent_name)>.<b64(context_run_id)>`. Runs recorded then
    keep that id; this gives it back for a run id derived now, so a lookup can point there.
    """
    if not derived.startswith(DERIVED_RUN_ID_PREFIX):
        return None
    body = derived[len(DERIVED_RUN_ID_PREFIX) :]
    try:
        payload = base64.urlsafe_b64decode(body + '=' * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return None
    length, colon, rest = payload.partition(b':')
    if not colon or not length.isdigit() or int(length) > len(rest):
        return None
    name, context_run_id = rest[: int(length)], rest[int(length) :]
    if not name or not context_run_id:
        return None
    dotted = f'{_b64(name)}.{_b64(context_run_id)}'
    return dotted if len(dotted) <= MAX_RUN_ID_LENGTH else None
