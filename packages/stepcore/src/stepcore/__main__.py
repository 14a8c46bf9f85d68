"""`python -m stepcore`: the same as the `stepcore` command."""

from __future__ import annotations

from stepcore.cli.root import main

if __name__ == '__main__':
    main()
