"""Reading stores written by pydantic-ai-harness, and importing their runs into a stepcore store.

```python
from stepcore.harness import import_harness

summary = await import_harness('harness.db', store)  # or the root folder of its file store
```

- `import_harness` (`importer.py`): copies every run, idempotently.
- `open_harness_source` and the sources (`sqlite_source.py`, `file_source.py`): a harness store's
  runs as stepcore records, one run at a time.
- `markers.py`: the harness's externalized-media markers put back inline.
- `records.py`: harness records as stepcore's.

`step_sqlite` uses the same reader and importer to migrate a harness SQLite database in place.
"""

from __future__ import annotations

from stepcore.harness.file_source import HarnessFileSource, is_harness_folder
from stepcore.harness.importer import HarnessImportSummary, import_harness, open_harness_source
from stepcore.harness.markers import restore_harness_media
from stepcore.harness.source import HarnessRun, HarnessSource
from stepcore.harness.sqlite_source import HarnessSqliteSource, is_harness_sqlite, open_harness_sqlite

__all__ = (
    'HarnessFileSource',
    'HarnessImportSummary',
    'HarnessRun',
    'HarnessSource',
    'HarnessSqliteSource',
    'import_harness',
    'is_harness_folder',
    'is_harness_sqlite',
    'open_harness_source',
    'open_harness_sqlite',
    'restore_harness_media',
)
