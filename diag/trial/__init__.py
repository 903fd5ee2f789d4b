"""``diag try``: measure a fix before making it (docs/try.md).

``plan`` picks the knobs (from ``--knob`` or a run's findings), ``engine`` runs the script with them
applied from outside (the probe extension :mod:`diag.probe.knobapply`), ``judge`` turns step times and
losses into speed-ups with intervals and verdicts, ``workdir`` contains each run's side effects."""
