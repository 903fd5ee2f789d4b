"""View-models of the TUI's panes, one module per widget in :mod:`diag.tui.widgets` (same name).

A view-model turns Evidence, GPU samples or form input into what its pane shows; it imports no textual, so
it is tested without an app. ``gpus`` → widgets/gpus.py, ``cost`` → widgets/cost.py, ``steps`` →
widgets/steps.py. What the whole app consumes (the run or replay feed, snapshots) is :mod:`diag.tui.live`.
"""
