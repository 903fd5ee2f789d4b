"""The text rendering of ``diag memory``'s plan (``Evidence.memory_plan``, built by :mod:`diag.memory.verdict`)."""
from __future__ import annotations

from diag.memory.units import fmt_bytes

CATEGORY_LABELS = (("parameters", "params"), ("gradients", "grads"), ("optimizer_state", "optim"),
                   ("activations", "activ"), ("other", "other"))


def render_plan(plan: dict, console, script: str | None = None) -> None:
    # every string in the plan came from evidence: control characters are shown escaped
    from diag.sanitize import for_terminal, safe_evidence_strings

    plan = safe_evidence_strings(plan, multiline_keys=("snippet", "traceback"))
    script = for_terminal(script) if script else script
    from rich.table import Table
    from rich.text import Text

    tgt = plan.get("target") or {}
    est = plan.get("estimate") or {}
    head = "Memory plan" + (f" for {script}" if script else "")
    if tgt.get("name"):
        head += f" on {tgt['name']}"
    console.print(Text(head, style="bold"))
    if plan["status"] != "ok":
        word = "skipped" if plan["status"] == "skipped" else "no plan"
        console.print(f"[yellow]{word}[/]: {plan.get('reason')}")
        _render_live(plan, console)
        render_sharded(plan.get("sharded"), console)
        return
    v = plan["verdict"]
    rep = est.get("replay") or {}
    cap = est.get("capacity")
    if cap:
        src = tgt.get("source") or est.get("capacity_source") or "given"
        console.print(f"device memory {fmt_bytes(cap)} ({src}); {est.get('headroom', 0.1):.0%} headroom -> "
                      f"{fmt_bytes(est.get('usable'))} usable")
    else:
        console.print("[yellow]no target device[/]: give --gpu NAME or --memory SIZE to find the largest batch "
                      "that fits")
    opts = ", ".join(rep.get("optimizers") or []) or "none"
    console.print(f"replayed on fake {rep.get('replay_device', 'cpu').upper()} tensors: model {rep.get('model')}, "
                  f"optimizer {opts}, autocast {rep.get('autocast') or 'off'}, "
                  f"zero_grad(set_to_none={rep.get('zero_grad_set_to_none')}); observed batch "
                  f"{est.get('observed_batch')}; {est.get('replays')} replays in {est.get('seconds')} s")
    eval_only = est.get("mode") == "eval"     # an evaluation-only run: its evaluation forward was replayed
    rows = [p for p in est.get("points") or [] if p["batch"] in set(est.get("table") or [])] or \
        list(est.get("points") or [])
    if eval_only:
        rows = list((est.get("eval") or {}).get("points") or [])
    def num(n) -> str:
        # each cell in its own unit: a small model's parameters are "1.5 MiB", never "0.00" of a GiB column
        return "N/A" if n is None else fmt_bytes(n)

    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold",
              title=f"estimated peak per {'evaluation forward (inference_mode)' if eval_only else 'training step'}",
              title_justify="left")
    t.add_column("batch", justify="right")
    for _, label in CATEGORY_LABELS:
        t.add_column(label, justify="right")
    t.add_column("allocated", justify="right")
    t.add_column("device", justify="right")
    if cap:
        t.add_column("fits", justify="center")
    target = v.get("target_batch")
    for p in rows:
        c = p.get("categories", {})
        mark = "*" if p["batch"] == target else " "
        row = [f"{p['batch']:,}{mark}"] + [num(c.get(k, 0)) for k, _ in CATEGORY_LABELS] + \
              [num(p.get("allocated")), num(p.get("device"))]
        if cap:
            row.append("[green]yes[/]" if p.get("fits") else "[red]no[/]")
        t.add_row(*row)
    console.print(t)
    console.print("allocated ~ torch.cuda.max_memory_allocated (replay peak + cuBLAS/cuDNN workspaces); device "
                  "adds the allocator's cache and the CUDA context; * your batch")
    if cap:
        mb = v.get("max_batch")
        search = est.get("search") or {}
        if mb:
            console.print(f"[bold]largest training batch that fits: {mb:,}[/] "
                          f"{search_basis(mb, search, est.get('points'))}")
        if eval_only:
            pass      # no training batch to judge: the evaluation line below says what fits
        elif v.get("fits") is True:
            console.print(f"[green]your batch {target:,} fits[/]: estimated {fmt_bytes(v.get('peak_device'))} "
                          f"of {fmt_bytes(v.get('usable'))} usable")
        elif v.get("fits") is False:
            console.print(f"[red]your batch {target:,} does not fit[/]: estimated {fmt_bytes(v.get('peak_device'))} "
                          f"> {fmt_bytes(v.get('usable'))} usable")
            acc = v.get("accumulation")
            if acc:
                exact = "" if acc.get("exact") else " (the last micro-batch is smaller)"
                console.print(f"keep the effective batch {acc['effective_batch']:,} with micro-batch "
                              f"{acc['micro_batch']:,} x {acc['steps']} gradient accumulation steps{exact}:")
                console.print(Text(acc.get("snippet", ""), style="cyan"))
            else:
                console.print("not even one sample per step fits: parameters, gradients and optimizer state alone "
                              "exceed the device; use bf16 weights, an 8-bit or sharded optimizer (FSDP/ZeRO), or "
                              "a larger device")
        me = v.get("max_eval_batch")
        if me:
            cur = v.get("eval_batch")
            extra = f" (the script evaluates at {cur:,})" if cur else ""
            console.print(f"[bold]largest evaluation batch under inference_mode: {me:,}[/]{extra}")
    al = (est.get("at_target") or {}).get("allowances") or {}
    if al:
        console.print("allowances added to the replay: " + ", ".join(
            f"{k.replace('_', ' ')} {fmt_bytes(b)}" for k, b in al.items()) + " (docs/memory.md)")
    for n in list(rep.get("notes") or []) + list(est.get("notes") or []):
        console.print(f"[yellow]note[/]: {n}")
    _render_live(plan, console)
    render_sharded(plan.get("sharded"), console)


def render_sharded(sh: dict | None, console) -> None:
    """One rank of a sharded job (``plan["sharded"]``, :mod:`diag.memory.sharded`)."""
    if not sh:
        return
    from rich.table import Table
    from rich.text import Text

    console.print()
    inf = sh.get("inferred")
    if sh.get("status") != "ok":
        what = f"the run is sharded ({inf['strategy']}, world size {inf['world']}; {inf['source']})" if inf else \
            "sharded plan"
        console.print(Text(f"Sharded: {what}", style="bold"))
        console.print(f"[yellow]skipped[/]: {sh.get('reason')}")
        m = sh.get("measured")
        if m:
            console.print("measured on rank 0 (its local shards): " + ", ".join(
                f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in m.items()))
        return
    r = sh["rank"]
    head = f"Sharded: one rank of {sh['world']:,} under {sh['label']}"
    if inf:
        head += f" (as the run ran: {inf['source']})"
    console.print(Text(head, style="bold"))
    div = r.get("divisors") or {}
    console.print(f"{sh['psi']:,} parameters; per rank batch {sh['batch_per_rank']:,} (global {sh['global_batch']:,})"
                  + (f", {sh['mixed_precision']} mixed precision" if sh.get("mixed_precision") else "")
                  + "; divided by: parameters " + str(div.get("parameters")) + ", gradients "
                  + str(div.get("gradients")) + ", optimizer state " + str(div.get("optimizer_state")))
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold", title="per rank", title_justify="left")
    for col in ("", "unsharded", "per rank"):
        t.add_column(col, justify="right" if col else "left")
    un = (sh.get("one_gpu") or {}).get("state") or {}     # one replica, in the plan's precision
    for label in ("parameters", "gradients", "optimizer state"):
        key = label.replace(" ", "_")
        t.add_row(label, fmt_bytes(un.get(key)), fmt_bytes((r.get("state") or {}).get(key)))
    ph = (r.get("phases") or {}).get(r.get("peak_phase")) or {}
    acts = r.get("activations_included", True)
    t.add_row("activations and temporaries", "", fmt_bytes(ph.get("transient")) if acts else "not replayed")
    t.add_row("communication buffers", "", fmt_bytes(ph.get("comm")))
    if r.get("mixed_copies"):
        t.add_row("of which fp32 master copy (in optimizer state)", "", fmt_bytes(r["mixed_copies"]))
    label = f"allocated (peak, in the {r.get('peak_phase')})" if acts else "allocated (state and buffers only)"
    t.add_row(label, fmt_bytes(sh["one_gpu"]["allocated"]), fmt_bytes(r.get("allocated")))
    t.add_row("device", fmt_bytes(sh["one_gpu"]["device"]), fmt_bytes(r.get("device")))
    console.print(t)
    comm = r.get("comm") or {}
    if comm:
        console.print("communication buffers: " + "; ".join(
            f"{phase}: " + ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in parts.items())
            for phase, parts in comm.items())
            + (f" (largest unit {sh['unit_params']:,} parameters: {sh.get('unit_source')})"
               if sh.get("strategy") in ("fsdp", "hybrid", "zero3", "shard-grad-op") else ""))
    if sh.get("buckets"):
        console.print("DeepSpeed buckets (elements): " + ", ".join(f"{k} {v:.3g}" for k, v in sh["buckets"].items()))
    if sh.get("usable") is not None:
        if sh.get("fits"):
            console.print(f"[green]each rank fits[/]: {fmt_bytes(r['device'])} of {fmt_bytes(sh['usable'])} usable")
        else:
            console.print(f"[red]a rank does not fit[/]: {fmt_bytes(r['device'])} > {fmt_bytes(sh['usable'])} usable")
        if sh.get("max_batch"):
            console.print(f"[bold]largest batch per rank that fits: {sh['max_batch']:,}[/] "
                          f"(global {sh['max_batch'] * sh['world']:,} at world size {sh['world']:,})")
        if sh.get("world_needed"):
            one = "fits on one GPU unsharded" if sh.get("fits_one_gpu") else "does not fit one GPU"
            console.print(f"[bold]smallest world size that fits batch {sh['batch_per_rank']:,} per rank: "
                          f"{sh['world_needed']:,}[/] (the model {one})")
        elif sh.get("world_needed_reason"):
            console.print(f"[yellow]{sh['world_needed_reason']}[/]")
    for n in sh.get("notes") or []:
        console.print(f"[yellow]note[/]: {n}")


def search_basis(mb: int, search: dict, points=None) -> str:
    """How the largest batch was found, in the precision reached (the search's bracket, or a replayed
    table point just above it), not the precision it was allowed: "(bisection: 54,510 does not fit; 17
    replays)" when the bracket is one sample, "(bisection, a lower bound: 55,000 does not fit, 0.9%
    above; ...)" when the search stopped on its precision."""
    trials = search.get("trials")
    ff = search.get("first_fail")
    fails = [p["batch"] for p in points or [] if p.get("fits") is False and p.get("batch", 0) > mb]
    if fails:
        ff = min([ff] + fails) if ff is not None else min(fails)
    tail = f"; {trials} replays" if trials else ""
    if ff is None:
        return f"(the search limit{tail})"
    if ff - mb <= 1:
        return f"(bisection: {ff:,} does not fit{tail})"
    return f"(bisection, a lower bound: {ff:,} does not fit, {(ff - mb) / mb:.1%} above{tail})"


def _render_live(plan: dict, console) -> None:
    live = plan.get("live") or {}
    b = live.get("breakdown")
    if b:
        c = b.get("categories", {})
        parts = ", ".join(f"{label} {fmt_bytes(c.get(k, 0))}" for k, label in CATEGORY_LABELS)
        dev = (live.get("device") or {}).get("name", "the GPU")
        console.print(f"measured on {dev}: peak {fmt_bytes(b.get('peak'))} allocated at step {b.get('step')} "
                      f"({parts})")
    oom = live.get("oom")
    if oom:
        console.print(f"[red]the script ran out of memory at step {oom.get('step')}[/]")
