"""Sub-commands of the ``diag`` CLI (one module each; see diag/cli.py)."""
