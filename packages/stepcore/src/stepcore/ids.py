"""Run id rules shared by the capability and the stores."""

from __future__ import annotations

import base64
import re

__all__ = ('MAX_RUN_ID_LENGTH', 'derive_run_id', 'validate_path_safe_run_id')

MAX_RUN_ID_LENGTH = 200
_PATH_SAFE = re.compile(r'[A-Za-z0-9_.\-]{1,200}')


def validate_path_safe_run_id(run_id: object) -> str:
    """Return `run_id` if it can name a folder safely; `ValueError` otherwise."""
    if not isinstance(run_id, str) or not _PATH_SAFE.fullmatch(run_id) or '..' in run_id or run_id == '.':
        raise ValueError(
            f'run_id {run_id!r} is not path-safe: use 1-{MAX_RUN_ID_LENGTH} of A-Z a-z 0-9 _ . -, not "." and no ".."'
        )
    return run_id


def _b64(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode('ascii').rstrip('=')


def derive_run_id(agent_name: str, context_run_id: str) -> str:
    """A path-safe id naming both the agent and the run, distinct for distinct pairs.

    The form is `<b64(agent_name)>.<b64(context_run_id)>` in unpadded base64url: `.` never occurs
    in base64url, so the split is unambiguous and the encoding injective. Longer than 200
    characters raises `ValueError`, and so does an empty agent name or run id (the result would
    not name a run).
    """
    if not agent_name or not context_run_id:
        raise ValueError(
            f'cannot derive a run id from agent_name={agent_name!r} and run id {context_run_id!r}: '
            'both must be non-empty (leave agent_name=None to use the run id as is)'
        )
    run_id = f'{_b64(agent_name)}.{_b64(context_run_id)}'
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise ValueError(
            f'the run id derived from agent_name={agent_name!r} and run id {context_run_id!r} is {len(run_id)} '
            f'characters, over the {MAX_RUN_ID_LENGTH}-character limit: use a shorter agent_name or pass run_id='
        )
    return run_id
