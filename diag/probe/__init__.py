"""Code that runs inside the user's process. ``python -m diag.probe SCRIPT [ARGS]`` runs a script
under the probe; :mod:`diag.probe.core` holds the hooks; :mod:`diag.probe.extensions` lists the
extensions that add observations (memory, FLOPs, ...)."""
