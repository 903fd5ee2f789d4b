"""Event kinds: the probe writes them (one JSON object per line in the events file), :mod:`diag.fold`
turns them into Evidence. Each event carries ``kind``, ``t`` (seconds since the probe started) and
``rank``. Shared by both sides so that a kind is spelled once.
"""
from __future__ import annotations

START = "start"                 # pid, host, local_rank, world_size, started_at
ENV = "env"                     # Environment fields (replaces environment)
MODEL = "model"                 # ModelInfo fields (first top-level forward of a module)
FORWARD_SITE = "forward_site"   # ForwardSite fields (new combination of model, call site and mode)
FORWARD_COUNTS = "forward_counts"  # {counts: {site_key: total}} (at the end of a run)
STEP = "step"                   # StepRecord fields (+ forward_counts for sites called since the last step)
DATALOADER = "dataloader"       # DataLoaderInfo fields (cumulative; replaces the record with that id)
OPTIMIZER = "optimizer"         # OptimizerInfo fields (cumulative)
EXCEPTION = "exception"         # ExceptionInfo fields
END = "end"                     # status, exit_code, reason, steps
EVALUATION = "evaluation"       # EvaluationPass fields (one evaluation pass between training steps)
EVAL_STEP = "eval_step"         # EvalStepRecord fields (one evaluation forward on one batch)
EVAL_SYNCS = "eval_syncs"       # {sites: [...]}: where per-batch host syncs were made in evaluation
FRAMEWORK = "framework"         # FrameworkInfo fields (the training framework, once)
CHILD = "child"                 # ChildProcess fields (a child process that trained; at its end)
PROBE_ERROR = "probe_error"     # where, error, traceback (a probe hook failed; the run went on)
SET = "set"                     # {path: "memory.estimate", value}: set a key in a rank section
APPEND = "append"               # {path: "memory.steps", value, limit}: append to a list in a rank section
MERGE = "merge"                 # {path: "memory", value: {...}}: update an object in a rank section
PROBE_SAMPLING = "probe_sampling"  # the probe's sampling of its per-step extras changed: step (the first step
                                # it applies to), period (1 step in period), budget, step_s, core_s, extras_s, reason

SECTION_EVENTS = (SET, APPEND, MERGE)
ALL = (START, ENV, MODEL, FORWARD_SITE, FORWARD_COUNTS, STEP, DATALOADER, OPTIMIZER, EXCEPTION, END,
       EVALUATION, EVAL_STEP, EVAL_SYNCS, FRAMEWORK, CHILD, PROBE_ERROR, SET, APPEND, MERGE, PROBE_SAMPLING)

# Rank sections addressable by set/append/merge paths ("memory.steps", "extras.perf", ...).
SECTIONS = ("memory", "flops", "amp", "sync", "distributed", "extras", "probe", "timeline")
