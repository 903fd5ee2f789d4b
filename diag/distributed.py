"""TEMPORARY alias of :mod:`diag.torchrun` (renamed: three ``distributed.py`` modules were confusing).

Only ``diag/runner.py`` still imports this name; it is being edited on another branch, so the lead points its
two imports at ``diag.torchrun`` when merging and deletes this file.
"""
from diag.torchrun import (format_root_cause, root_cause, root_cause_summary,  # noqa: F401
                           validate_torchrun, with_local_rendezvous)
