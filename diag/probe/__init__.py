"""Code that runs inside the user's process. ``python -m diag.probe SCRIPT [ARGS]`` runs a script
under the probe; :mod:`diag.probe.core` holds the hooks and the step state machine;
:mod:`diag.probe.context` the extension interface (``ProbeContext``, ``Extension``);
:mod:`diag.probe.extensions` lists the extensions that add observations (performance, memory,
FLOPs, distributed). The layout is described in docs/probe.md."""
