"""Tells stepcore about the `template` backend. Imported at plugin discovery, so it imports nothing heavy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
    local_path,
    query_options,
)


def template_url_options(url: str) -> dict[str, Any]:
    """`template:///abs/runs` (or `template:runs`, relative) -> `directory=`; a query adds options."""
    directory: Path = local_path(url, what='folder', example='template:///path/to/runs')
    return {'directory': directory, **query_options(url)}


register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='template',
        factory='stepcore_template.store:TemplateStepStore',
        schemes=('template',),
        url_options=template_url_options,
        summary='One JSON file per record in a folder.',
    ),
)
