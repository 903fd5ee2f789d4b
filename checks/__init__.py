"""Built-in checks, installed as the package ``diag.checks`` and registered through the
``diag.checks`` entry-point group (see pyproject.toml). One module per topic; every check is a
pure function of Evidence (no torch, no NVML, no filesystem)."""
