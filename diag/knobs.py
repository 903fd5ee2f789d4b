"""The knob catalogue: every fix that is a setting, once, in the words of each framework.

A *knob* is a setting that changes how a run performs without changing what it computes (bf16
autocast, TF32, DataLoader workers, pin_memory, torch.compile, a fused optimizer, the evaluation
batch, ...). For each knob the table says when it applies, how ``diag try`` applies it from outside
the script (``mode``: "switch" between blocks of steps of one process, "restart" in runs of its own,
"none" with the reason in ``outside``; docs/try.md), and how the user writes it in plain PyTorch, under the Hugging
Face ``Trainer`` (``TrainingArguments``), Lightning (``Trainer(...)``, the ``*_dataloader`` hooks) and
Accelerate (``Accelerator(...)``, ``accelerate config``).

Checks word their fixes from it (through :func:`diag.checks.api.knob_words`), according to the
framework the evidence says drove the loop (``RankEvidence.framework``). docs/checks.md shows the
table (``diag checks --format markdown``). Pure data and string formatting: no torch, no I/O.

A spelling's ``fix`` and ``snippet`` are ``str.format`` templates; the values a check passes (``n``,
``mode``...) fill them, and a missing value is shown as ``N``. A framework whose spelling is
``NO_LEVER`` has no setting for the knob: the check says so (the fix is the framework's code, or the
plain-PyTorch call where that still reaches the run).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

FRAMEWORKS = ("torch", "transformers", "lightning", "accelerate")
FRAMEWORK_NAMES = {"torch": "plain PyTorch", "transformers": "the Hugging Face Trainer",
                   "lightning": "Lightning's Trainer", "accelerate": "Accelerate"}


@dataclass(frozen=True)
class Spelling:
    """How one framework's user turns a knob: one sentence and a snippet (templates)."""
    fix: str
    snippet: str | None = None
    lever: bool = True          # False: the framework offers no setting (the sentence says what to do)


def NO_LEVER(why: str, snippet: str | None = None) -> Spelling:     # noqa: N802 (reads as a table cell)
    return Spelling(why, snippet, lever=False)


@dataclass(frozen=True)
class Knob:
    id: str                                # stable, dotted: amp.bf16, dataloader.workers
    title: str
    applies: str                           # when it applies (what the checks look for)
    trial: str                             # how a trial applies it from outside the script (diag try)
    checks: tuple[str, ...]                # the checks whose fix it words
    words: dict[str, Spelling] = field(default_factory=dict)   # framework -> spelling ("torch" always)
    # diag try (docs/try.md): "switch" (the probe turns it on and off between blocks of steps of one
    # process), "restart" (set when an object is built: a run of its own), "none" (not from outside:
    # ``outside`` says why); ``param``: the value the id takes (dataloader.workers=N), None for a flag
    mode: str = "none"
    param: str | None = None
    outside: str = ""

    def spelling(self, framework: str | None) -> Spelling:
        return self.words.get(framework or "torch") or self.words["torch"]


class _Default(dict):
    def __missing__(self, key):
        return "N"


def _fmt(text: str | None, values: dict) -> str | None:
    return None if text is None else text.format_map(_Default(values))


_KNOBS = [
    Knob("amp.bf16", "bf16 mixed precision for training",
         "fp32 training on a GPU with bf16 tensor cores (compute capability >= 8.0)",
         "autocast to bfloat16 around every training forward and its loss",
         ("amp.unused", "gpu.low-utilization"), {
             "torch": Spelling('Run forward and loss under torch.autocast("cuda", dtype=torch.bfloat16) (no '
                               'GradScaler needed).',
                               'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)\n'
                               'loss.backward()\nopt.step()'),
             "transformers": Spelling("The Trainer runs autocast when asked: set TrainingArguments(bf16=True).",
                                      "args = TrainingArguments(..., bf16=True)"),
             "lightning": Spelling('Lightning runs autocast when asked: construct the Trainer with '
                                   'precision="bf16-mixed".',
                                   'trainer = L.Trainer(..., precision="bf16-mixed")'),
             "accelerate": Spelling('Accelerate autocasts the prepared model when asked: '
                                    'Accelerator(mixed_precision="bf16") (or answer bf16 in `accelerate config`, or '
                                    '`accelerate launch --mixed_precision bf16`).',
                                    'accelerator = Accelerator(mixed_precision="bf16")\n'
                                    'model, opt, loader = accelerator.prepare(model, opt, loader)'),
         }),
    Knob("amp.fp16", "fp16 mixed precision with gradient scaling",
         "fp32 training on a GPU with fp16 tensor cores but no bf16 (compute capability 7.x)",
         "autocast to float16 around every training forward, the loss scaled by a GradScaler",
         ("amp.unused", "amp.fp16-without-scaler"), {
             "torch": Spelling('Run forward and loss under torch.autocast("cuda", dtype=torch.float16) with a '
                               'GradScaler.',
                               'scaler = torch.amp.GradScaler("cuda")\nwith torch.autocast("cuda", dtype=torch.float16):\n'
                               '    loss = loss_fn(model(x), y)\nscaler.scale(loss).backward()\nscaler.step(opt)\n'
                               'scaler.update()'),
             "transformers": Spelling("Set TrainingArguments(fp16=True): the Trainer autocasts and scales the loss.",
                                      "args = TrainingArguments(..., fp16=True)"),
             "lightning": Spelling('Construct the Trainer with precision="16-mixed" (it autocasts and scales the '
                                   'loss).', 'trainer = L.Trainer(..., precision="16-mixed")'),
             "accelerate": Spelling('Accelerator(mixed_precision="fp16") autocasts and scales the loss in '
                                    'accelerator.backward(loss).',
                                    'accelerator = Accelerator(mixed_precision="fp16")\naccelerator.backward(loss)'),
         }),
    Knob("matmul.tf32", "TF32 tensor cores for fp32 matmuls",
         'fp32 matmuls on an Ampere-or-newer GPU with float32_matmul_precision "highest"',
         'torch.set_float32_matmul_precision("high") before the script runs',
         ("matmul.tf32",), {
             "torch": Spelling('Allow TF32 for fp32 matmuls at the start of the script (or train under bf16 '
                               'autocast, see amp.unused).',
                               'torch.set_float32_matmul_precision("high")\n'
                               'torch.backends.cudnn.allow_tf32 = True  # convolutions (default)'),
             "transformers": Spelling("Set TrainingArguments(tf32=True) (or train in bf16: bf16=True).",
                                      "args = TrainingArguments(..., tf32=True)"),
             "lightning": NO_LEVER('Lightning\'s Trainer has no TF32 argument: call '
                                   'torch.set_float32_matmul_precision("high") at the top of the script (or '
                                   'train with precision="bf16-mixed").',
                                   'torch.set_float32_matmul_precision("high")\ntrainer = L.Trainer(...)'),
             "accelerate": NO_LEVER('Accelerator has no TF32 argument: call torch.set_float32_matmul_precision('
                                    '"high") at the top of the script (or mixed_precision="bf16").',
                                    'torch.set_float32_matmul_precision("high")'),
         }),
    Knob("eval.bf16", "bf16 for evaluation",
         "evaluation forwards in fp32 on a GPU with bf16 tensor cores",
         "autocast to bfloat16 around every evaluation forward",
         ("eval.amp",), {
             "torch": Spelling('Wrap the evaluation loop in torch.autocast("cuda", dtype=torch.{dtype}) (no '
                               'GradScaler: there is no backward).',
                               'with torch.no_grad(), torch.autocast("cuda", dtype=torch.{dtype}):\n'
                               '    for x, y in val_loader:\n        out = model(x)'),
             "transformers": Spelling("Set TrainingArguments(bf16=True): the Trainer's evaluation runs under "
                                      "autocast too (bf16_full_eval=True instead casts the model to bf16 for "
                                      "evaluation: faster still, numbers differ slightly).",
                                      "args = TrainingArguments(..., bf16=True)   # or bf16_full_eval=True"),
             "lightning": Spelling('Construct the Trainer with precision="bf16-mixed": validation and test run '
                                   'under autocast too.', 'trainer = L.Trainer(..., precision="bf16-mixed")'),
             "accelerate": Spelling('Accelerator(mixed_precision="bf16") autocasts every forward of the '
                                    'prepared model, evaluation included.',
                                    'accelerator = Accelerator(mixed_precision="bf16")'),
         }),
    Knob("dataloader.workers", "DataLoader worker processes",
         "the training loop waits for batches built in the main process or by too few workers",
         "num_workers set on the training DataLoader",
         ("dataloader.workers", "gpu.low-utilization", "gpu.idle"), {
             "torch": Spelling("Give the DataLoader num_workers={n}.",
                               "loader = DataLoader(dataset, batch_size={batch_size}, num_workers={n},\n"
                               "                    persistent_workers=True)"),
             "transformers": Spelling("The Trainer builds the DataLoader: set TrainingArguments("
                                      "dataloader_num_workers={n}).",
                                      "args = TrainingArguments(..., dataloader_num_workers={n}, "
                                      "dataloader_persistent_workers=True)"),
             "lightning": Spelling("Lightning iterates the DataLoader your LightningModule / LightningDataModule "
                                   "returns: build it with num_workers={n} in train_dataloader().",
                                   "def train_dataloader(self):\n    return DataLoader(self.train_set, "
                                   "batch_size={batch_size}, num_workers={n}, persistent_workers=True)"),
             "accelerate": Spelling("Accelerate keeps the DataLoader you pass to accelerator.prepare(): build it "
                                    "with num_workers={n}.",
                                    "loader = DataLoader(dataset, batch_size={batch_size}, num_workers={n}, "
                                    "persistent_workers=True)\n"
                                    "model, opt, loader = accelerator.prepare(model, opt, loader)"),
         }),
    Knob("dataloader.pin-memory", "pinned host memory for batches",
         "CUDA training whose batches are copied from pageable memory",
         "pin_memory=True on the training DataLoader",
         ("dataloader.pin-memory", "gpu.idle"), {
             "torch": Spelling("Let the DataLoader pin batches (pin_memory=True) and copy them with "
                               "non_blocking=True; for tensors built by hand, call .pin_memory() before the copy.",
                               "loader = DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True)\n"
                               "for x, y in loader:\n    x = x.to(device, non_blocking=True)\n"
                               "    y = y.to(device, non_blocking=True)"),
             "transformers": Spelling("The Trainer builds the DataLoader and pins it unless told not to: set "
                                      "TrainingArguments(dataloader_pin_memory=True) (the default; remove a "
                                      "dataloader_pin_memory=False).",
                                      "args = TrainingArguments(..., dataloader_pin_memory=True)"),
             "lightning": Spelling("Lightning iterates the DataLoader your train_dataloader() returns (and moves "
                                   "its batches to the GPU itself): build it with pin_memory=True.",
                                   "def train_dataloader(self):\n    return DataLoader(self.train_set, "
                                   "batch_size=..., num_workers=4, pin_memory=True)"),
             "accelerate": Spelling("Build the DataLoader you pass to accelerator.prepare() with pin_memory=True "
                                    "(the prepared loader moves the batches to the GPU).",
                                    "loader = DataLoader(dataset, batch_size=..., pin_memory=True)\n"
                                    "model, opt, loader = accelerator.prepare(model, opt, loader)"),
         }),
    Knob("dataloader.persistent-workers", "DataLoader workers kept across epochs",
         "a DataLoader with workers that restarts them every epoch",
         "persistent_workers=True on the training DataLoader",
         ("dataloader.persistent-workers",), {
             "torch": Spelling("Keep the workers alive between epochs with persistent_workers=True.",
                               "loader = DataLoader(dataset, batch_size={batch_size}, num_workers={n},\n"
                               "                    persistent_workers=True)"),
             "transformers": Spelling("The Trainer builds the DataLoader (a new iterator every epoch): set "
                                      "TrainingArguments(dataloader_persistent_workers=True).",
                                      "args = TrainingArguments(..., dataloader_num_workers={n}, "
                                      "dataloader_persistent_workers=True)"),
             "lightning": Spelling("Lightning iterates the DataLoader your train_dataloader() returns: build it "
                                   "with persistent_workers=True.",
                                   "def train_dataloader(self):\n    return DataLoader(self.train_set, "
                                   "batch_size={batch_size}, num_workers={n}, persistent_workers=True)"),
             "accelerate": Spelling("Build the DataLoader you pass to accelerator.prepare() with "
                                    "persistent_workers=True.",
                                    "loader = DataLoader(dataset, batch_size={batch_size}, num_workers={n}, "
                                    "persistent_workers=True)"),
         }),
    Knob("cudnn.benchmark", "cuDNN auto-tuner",
         "a model with real convolutions (nn.ConvNd) trained on CUDA with fixed input shapes",
         "torch.backends.cudnn.benchmark = True before the script runs",
         ("cudnn.benchmark",), {
             "torch": Spelling("Enable the auto-tuner before the training loop (results may differ bit-wise "
                               "between runs; keep it off if you need cudnn.deterministic).",
                               "torch.backends.cudnn.benchmark = True"),
             "transformers": NO_LEVER("TrainingArguments has no cuDNN switch: set torch.backends.cudnn.benchmark = "
                                      "True at the top of the script.", "torch.backends.cudnn.benchmark = True"),
             "lightning": Spelling("Construct the Trainer with benchmark=True.",
                                   "trainer = L.Trainer(..., benchmark=True)"),
             "accelerate": NO_LEVER("Accelerator has no cuDNN switch: set torch.backends.cudnn.benchmark = True at "
                                    "the top of the script.", "torch.backends.cudnn.benchmark = True"),
         }),
    Knob("optim.set-to-none", "gradients set to None instead of zeroed",
         "zero_grad(set_to_none=False) every step",
         "zero_grad's set_to_none forced to True",
         ("optim.zero-grad",), {
             "torch": Spelling("Call zero_grad() with its default set_to_none=True (or set param.grad = None).",
                               "optimizer.zero_grad()   # set_to_none=True is the default since PyTorch 2.0"),
             "transformers": NO_LEVER("The Trainer zeroes the gradients itself (model.zero_grad(), set_to_none by "
                                      "default) and has no setting for it: a set_to_none=False comes from code of yours (a callback, a Trainer "
                                      "subclass, an optimizer wrapper); if there is none, nothing to change."),
             "lightning": Spelling("Lightning calls optimizer.zero_grad() itself: if you override "
                                   "optimizer_zero_grad, call zero_grad(set_to_none=True) there.",
                                   "def optimizer_zero_grad(self, epoch, batch_idx, optimizer):\n"
                                   "    optimizer.zero_grad(set_to_none=True)"),
             "accelerate": Spelling("Call optimizer.zero_grad() with its default set_to_none=True.",
                                    "optimizer.zero_grad()"),
         }),
    Knob("optim.fused", "fused optimizer kernels",
         "an optimizer over CUDA parameters on its for-loop (or foreach) implementation where fused exists",
         "fused=True passed to the optimizer's constructor",
         ("optim.foreach-fused",), {
             "torch": Spelling("Construct {cls} with {better}.",
                               "opt = torch.optim.{cls}(model.parameters(), lr=..., {better})"),
             "transformers": Spelling('The Trainer builds the optimizer: set TrainingArguments(optim='
                                      '"adamw_torch_fused") (AdamW, fused; an optimizer you pass in '
                                      'Trainer(optimizers=(opt, scheduler)) you construct with {better} yourself).',
                                      'args = TrainingArguments(..., optim="adamw_torch_fused")'),
             "lightning": Spelling("Lightning steps the optimizer your configure_optimizers() returns: construct "
                                   "{cls} there with {better}.",
                                   "def configure_optimizers(self):\n"
                                   "    return torch.optim.{cls}(self.parameters(), lr=..., {better})"),
             "accelerate": Spelling("Construct the {cls} you pass to accelerator.prepare() with {better}.",
                                    "opt = torch.optim.{cls}(model.parameters(), lr=..., {better})"),
         }),
    Knob("compile", "torch.compile",
         "an uncompiled model whose forward+backward dominate a long run",
         "the trained module compiled with torch.compile",
         ("compile.unused",), {
             "torch": Spelling("Try model = torch.compile(model) on a long run once the data pipeline keeps up; "
                               "compare step times after the first (compiling) steps.",
                               'model = torch.compile(model)   # or model.compile(); mode="max-autotune" for long runs'),
             "transformers": Spelling("The Trainer compiles the model when asked: set TrainingArguments("
                                      "torch_compile=True) on a long run once the data pipeline keeps up; compare "
                                      "step times after the first (compiling) steps.",
                                      'args = TrainingArguments(..., torch_compile=True)   # torch_compile_mode='
                                      '"max-autotune" for long runs'),
             "lightning": Spelling("Compile the LightningModule before handing it to the Trainer: model = "
                                   "torch.compile(model), then trainer.fit(model, ...).",
                                   "model = torch.compile(model)\ntrainer.fit(model, train_loader)"),
             "accelerate": Spelling('Accelerate compiles the prepared model when asked: Accelerator('
                                    'dynamo_backend="inductor") (or the dynamo questions of `accelerate config`).',
                                    'accelerator = Accelerator(dynamo_backend="inductor")'),
         }),
    Knob("compile.cuda-graphs", "CUDA graphs (fewer kernel launches)",
         "a launch-bound step: the GPU waits for the CPU to launch many small kernels",
         'torch.compile(model, mode="reduce-overhead")',
         ("gpu.low-utilization",), {
             "torch": Spelling('Capture the step in CUDA graphs: torch.compile(model, mode="reduce-overhead") '
                               '(static shapes; memory for the graphs).',
                               'model = torch.compile(model, mode="reduce-overhead")'),
             "transformers": Spelling('Set TrainingArguments(torch_compile=True, torch_compile_mode='
                                      '"reduce-overhead").',
                                      'args = TrainingArguments(..., torch_compile=True, '
                                      'torch_compile_mode="reduce-overhead")'),
             "lightning": Spelling('Compile the LightningModule with mode="reduce-overhead" before trainer.fit.',
                                   'model = torch.compile(model, mode="reduce-overhead")\ntrainer.fit(model, ...)'),
             "accelerate": Spelling('Pass a TorchDynamoPlugin(backend="inductor", mode="reduce-overhead") to the '
                                    'Accelerator.',
                                    'from accelerate.utils import TorchDynamoPlugin\naccelerator = Accelerator('
                                    'dynamo_plugin=TorchDynamoPlugin(backend="inductor", mode="reduce-overhead"))'),
         }),
    Knob("train.accumulation", "gradient accumulation",
         "a larger effective batch than fits in memory (more work per optimizer step)",
         "N micro-batches per optimizer step",
         ("memory.oom", "gpu.low-utilization"), {
             "torch": Spelling("Accumulate gradients over {n} micro-batches per optimizer step (under DDP, "
                               "no_sync() on all but the last).",
                               "for i, (x, y) in enumerate(loader):\n    (loss_fn(model(x), y) / {n}).backward()\n"
                               "    if (i + 1) % {n} == 0:\n        opt.step(); opt.zero_grad()"),
             "transformers": Spelling("Set TrainingArguments(gradient_accumulation_steps={n}).",
                                      "args = TrainingArguments(..., gradient_accumulation_steps={n})"),
             "lightning": Spelling("Construct the Trainer with accumulate_grad_batches={n}.",
                                   "trainer = L.Trainer(..., accumulate_grad_batches={n})"),
             "accelerate": Spelling("Accelerator(gradient_accumulation_steps={n}) and the step under "
                                    "accelerator.accumulate(model).",
                                    "accelerator = Accelerator(gradient_accumulation_steps={n})\n"
                                    "with accelerator.accumulate(model):\n    accelerator.backward(loss); "
                                    "opt.step(); opt.zero_grad()"),
         }),
    Knob("eval.batch", "evaluation batch size",
         "evaluation in many small batches where a larger one fits",
         "batch_size of the evaluation DataLoader",
         ("eval.small-batch", "memory.eval-batch"), {
             "torch": Spelling("Give the evaluation DataLoader batch_size={n} (or the largest that fits: "
                               "`diag memory`).", "val_loader = DataLoader(val_set, batch_size={n}, shuffle=False)"),
             "transformers": Spelling("The Trainer builds the evaluation DataLoader: set TrainingArguments("
                                      "per_device_eval_batch_size={n}) (or the largest that fits: `diag memory`).",
                                      "args = TrainingArguments(..., per_device_eval_batch_size={n})"),
             "lightning": Spelling("Lightning iterates the DataLoader your val_dataloader() / test_dataloader() "
                                   "returns: build it with batch_size={n} (or the largest that fits: "
                                   "`diag memory`).",
                                   "def val_dataloader(self):\n    return DataLoader(self.val_set, batch_size={n}, "
                                   "shuffle=False)"),
             "accelerate": Spelling("Build the evaluation DataLoader you pass to accelerator.prepare() with "
                                    "batch_size={n}.", "val_loader = DataLoader(val_set, batch_size={n})"),
         }),
    Knob("eval.inference-mode", "inference_mode for evaluation",
         "evaluation forwards under no_grad rather than inference_mode",
         "torch.no_grad in evaluation replaced by torch.inference_mode",
         ("eval.inference-mode",), {
             "torch": Spelling("Evaluate under torch.inference_mode() instead of torch.no_grad().",
                               "with torch.inference_mode():\n    out = model(x)"),
             "transformers": NO_LEVER("The Trainer's evaluation loop opens its own no_grad (prediction_step) and "
                                      "has no switch for inference_mode: nothing to change in the script."),
             "lightning": Spelling("Trainer(inference_mode=True) (the default) runs validate()/test()/predict() "
                                   "under inference_mode; the validation inside fit() keeps no_grad, with no "
                                   "switch.", "trainer = L.Trainer(..., inference_mode=True)"),
             "accelerate": Spelling("Evaluate under torch.inference_mode() instead of torch.no_grad().",
                                    "with torch.inference_mode():\n    out = model(x)"),
         }),
    Knob("log.interval", "logging interval (values read back from the GPU)",
         "a loss or metric read back from the GPU (.item(), printing a tensor) every step",
         "none from outside: the logging interval is the script's or the framework's setting",
         ("sync.host-device", "gpu.idle"), {
             "torch": Spelling("Keep values on the GPU and read them every N steps: accumulate the loss in a "
                               "tensor and call .item() every {n} steps.",
                               'running = torch.zeros((), device="cuda")\nfor step, (x, y) in enumerate(loader):\n'
                               '    loss = train_step(x, y)\n    running += loss.detach()          # no sync\n'
                               '    if step % {n} == 0:\n        print(running.item() / {n})     # one sync per {n} '
                               'steps\n        running.zero_()'),
             "transformers": Spelling("The Trainer reads the loss back every logging_steps, and checks every step's "
                                      "loss for NaN/inf on the host (two syncs a step): set TrainingArguments("
                                      "logging_nan_inf_filter=False) and a larger logging_steps (and leave "
                                      "include_num_input_tokens_seen off: one .item() a step).",
                                      "args = TrainingArguments(..., logging_steps={n}, logging_nan_inf_filter=False)"),
             "lightning": Spelling("Lightning reads logged values back for the logger every log_every_n_steps and "
                                   "for the progress bar at every refresh: Trainer(log_every_n_steps={n}), a "
                                   "slower TQDMProgressBar(refresh_rate=...), and self.log(..., prog_bar=False) for "
                                   "per-step values.",
                                   "from lightning.pytorch.callbacks import TQDMProgressBar\n"
                                   "trainer = L.Trainer(..., log_every_n_steps={n}, "
                                   "callbacks=[TQDMProgressBar(refresh_rate={n})])"),
             "accelerate": Spelling("Keep values on the GPU and read them every N steps (accelerator.print of a "
                                    "tensor, .item() and accelerator.gather(...).item() each synchronise).",
                                    "if step % {n} == 0:\n    accelerator.print(loss.item())"),
         }),
    Knob("debug.anomaly", "autograd anomaly detection off",
         "anomaly detection on during training",
         "torch.autograd.set_detect_anomaly(False) forced",
         ("debug.anomaly-detection",), {
             "torch": Spelling("Remove the call, or enable it only while chasing a NaN (e.g. behind a --debug "
                               "flag).", "torch.autograd.set_detect_anomaly(args.debug)   # off for real training"),
             "transformers": NO_LEVER("Remove torch.autograd.set_detect_anomaly(True) / detect_anomaly() from the "
                                      "script (TrainingArguments has no such switch: it is the script's own call).",
                                      "torch.autograd.set_detect_anomaly(False)"),
             "lightning": Spelling("Construct the Trainer with detect_anomaly=False (the default); turn it on only "
                                   "while chasing a NaN.", "trainer = L.Trainer(..., detect_anomaly=False)"),
             "accelerate": Spelling("Remove the call, or enable it only while chasing a NaN.",
                                    "torch.autograd.set_detect_anomaly(False)"),
         }),
    Knob("ddp.find-unused", "DDP without find_unused_parameters",
         "DistributedDataParallel with find_unused_parameters=True while every parameter gets a gradient",
         "DDP constructed with find_unused_parameters=False",
         ("ddp.find-unused-parameters",), {
             "torch": Spelling("Construct DistributedDataParallel with find_unused_parameters=False (the default).",
                               "model = DDP(model, device_ids=[local_rank])"),
             "transformers": Spelling("The Trainer wraps the model in DDP: set TrainingArguments("
                                      "ddp_find_unused_parameters=False) (or leave it unset: the Trainer then "
                                      "decides from gradient checkpointing).",
                                      "args = TrainingArguments(..., ddp_find_unused_parameters=False)"),
             "lightning": Spelling('Use Trainer(strategy="ddp") (find_unused_parameters=False is Lightning\'s '
                                   'default) instead of strategy="ddp_find_unused_parameters_true" or '
                                   'DDPStrategy(find_unused_parameters=True).',
                                   'trainer = L.Trainer(strategy="ddp", ...)'),
             "accelerate": Spelling("accelerate wraps the model in DDP: pass DistributedDataParallelKwargs("
                                    "find_unused_parameters=False) to Accelerator(kwargs_handlers=[...]).",
                                    "from accelerate.utils import DistributedDataParallelKwargs\n"
                                    "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                                    "find_unused_parameters=False)])"),
         }),
    Knob("fsdp.unit-size", "FSDP units of whole blocks",
         "a sharded run (FSDP2, FSDP1) whose many small all-gathers and reduce-scatters dominate the step",
         "none (the units are built when the model is sharded)",
         ("sharded.exposed-comm",), {
             "torch": Spelling("Shard whole blocks: fully_shard(block) for each transformer block, then the root "
                               "(FSDP1: auto_wrap_policy=ModuleWrapPolicy({{Block}})), not every layer.",
                               "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)"),
             "transformers": Spelling("Wrap per decoder layer: TrainingArguments(fsdp=\"full_shard auto_wrap\", "
                                      "fsdp_config={{\"transformer_layer_cls_to_wrap\": [...]}}) with the model's block "
                                      "class, not a small min_num_params.",
                                      "args = TrainingArguments(..., fsdp=\"full_shard auto_wrap\",\n"
                                      "    fsdp_config={{\"transformer_layer_cls_to_wrap\": [\"Block\"]}})"),
             "lightning": Spelling("Give FSDPStrategy the block class to wrap: FSDPStrategy(auto_wrap_policy={{Block}}).",
                                   "trainer = L.Trainer(strategy=FSDPStrategy(auto_wrap_policy={{Block}}), ...)"),
             "accelerate": Spelling("Wrap per block in the FSDP plugin: fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP "
                                    "with fsdp_transformer_layer_cls_to_wrap set to the block class (accelerate config).",
                                    "fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                    "  fsdp_transformer_layer_cls_to_wrap: Block"),
         }),
    Knob("fsdp.prefetch", "FSDP prefetch",
         "a sharded run on GPUs whose all-gathers are issued only when each unit needs its parameters",
         "none (set when the model is sharded)",
         ("sharded.exposed-comm",), {
             "torch": Spelling("Prefetch the next unit's all-gather: FSDP2 set_modules_to_forward_prefetch / "
                               "set_modules_to_backward_prefetch; FSDP1 backward_prefetch=BackwardPrefetch.BACKWARD_PRE, "
                               "forward_prefetch=True.",
                               "for a, b in zip(blocks, blocks[1:]):\n    a.set_modules_to_forward_prefetch([b])\n"
                               "    b.set_modules_to_backward_prefetch([a])"),
             "transformers": Spelling("Set the prefetch in fsdp_config: TrainingArguments(fsdp_config={{"
                                      "\"backward_prefetch\": \"backward_pre\", \"forward_prefetch\": True}}).",
                                      "args = TrainingArguments(..., fsdp_config={{\"backward_prefetch\": \"backward_pre\",\n"
                                      "                                          \"forward_prefetch\": True}})"),
             "lightning": Spelling("Pass the prefetch to FSDPStrategy (its keyword arguments go to FSDP).",
                                   "trainer = L.Trainer(strategy=FSDPStrategy(backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n"
                                   "                                          forward_prefetch=True), ...)"),
             "accelerate": Spelling("Set fsdp_backward_prefetch: BACKWARD_PRE and fsdp_forward_prefetch: true in the FSDP "
                                    "plugin (accelerate config).",
                                    "fsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_forward_prefetch: true"),
         }),
    Knob("fsdp.cpu-offload", "FSDP without CPU offload",
         "FSDP offloading parameters to the CPU while the job fits on the GPU without it",
         "none (set when the model is sharded)",
         ("sharded.cpu-offload",), {
             "torch": Spelling("Drop the offload: FSDP2 fully_shard(...) without offload_policy=CPUOffloadPolicy(); "
                               "FSDP1 without cpu_offload=CPUOffload(offload_params=True).",
                               "fully_shard(module)   # no offload_policy"),
             "transformers": Spelling("Drop \"offload\" from TrainingArguments(fsdp=...).",
                                      "args = TrainingArguments(..., fsdp=\"full_shard auto_wrap\")"),
             "lightning": Spelling("Construct FSDPStrategy without cpu_offload.",
                                   "trainer = L.Trainer(strategy=FSDPStrategy(cpu_offload=False), ...)"),
             "accelerate": Spelling("Set fsdp_offload_params: false in the FSDP plugin (accelerate config).",
                                    "fsdp_config:\n  fsdp_offload_params: false"),
         }),
]

# diag try: how the probe extension (diag/probe/knobapply.py) applies each knob from outside the
# script, and why the others cannot be. A knob appended to _KNOBS without an entry here is "none".
_NOT_STEP = ("diag try times training steps; an evaluation knob needs evaluation steps timed knob off "
             "and on, which it does not do yet")
_TRIALS: dict[str, tuple[str, str | None, str]] = {
    "amp.bf16": ("switch", None, ""),
    "matmul.tf32": ("switch", None, ""),
    "cudnn.benchmark": ("switch", None, ""),
    "optim.set-to-none": ("switch", None, ""),
    "debug.anomaly": ("switch", None, ""),
    "dataloader.workers": ("restart", "N", ""),
    "dataloader.pin-memory": ("restart", None, ""),
    "dataloader.persistent-workers": ("restart", None, ""),
    "optim.fused": ("restart", None, ""),
    "compile": ("restart", None, ""),
    "amp.fp16": ("none", None, "fp16 needs a GradScaler in the script's backward and optimizer step "
                 "(scaler.scale(loss).backward(), scaler.step(opt)); diag does not rewrite them"),
    "eval.bf16": ("none", None, _NOT_STEP),
    "eval.batch": ("none", "N", _NOT_STEP),
    "eval.inference-mode": ("none", None, _NOT_STEP),
    "compile.cuda-graphs": ("none", None, "CUDA graphs need static shapes and memory the script must "
                            "plan for; try `compile` first"),
    "train.accumulation": ("none", "N", "it changes what a step computes (more samples per update), so "
                           "step times are not comparable"),
    "log.interval": ("none", "N", "the logging interval is the script's or the framework's own setting"),
    "ddp.find-unused": ("none", None, "diag try runs one process; DDP settings need torchrun"),
}
# what diag/probe/knobapply.py does, exactly (the `trial` sentence of each knob it applies)
_HOW = {
    "amp.bf16": "torch.autocast(device, dtype=torch.bfloat16) entered as the outermost training forward "
                "starts and left before the backward, so the loss is computed under it too (a script that "
                "autocasts to fp16 itself gets bf16 for the model's forward only)",
    "matmul.tf32": 'torch.set_float32_matmul_precision("high") during the knob\'s steps (CUDA, compute '
                   'capability >= 8.0)',
    "cudnn.benchmark": "torch.backends.cudnn.benchmark = True during the knob's steps (CUDA)",
    "optim.set-to-none": "Optimizer.zero_grad and Module.zero_grad called with set_to_none=True during the "
                         "knob's steps",
    "debug.anomaly": "anomaly detection switched off at each step's start and back on at its end",
    "dataloader.workers": "num_workers=N given to every DataLoader the script builds (DataLoader.__init__ "
                          "patched for the run; IterableDataset loaders keep theirs)",
    "dataloader.pin-memory": "pin_memory=True given to every DataLoader the script builds (CUDA)",
    "dataloader.persistent-workers": "persistent_workers=True given to every DataLoader with workers",
    "optim.fused": "fused=True given to each torch.optim optimizer the script builds (one that refuses it, "
                   "e.g. parameters on an unsupported device, is built as the script asked)",
    "compile": "Module.compile() on the outermost training model after its first training forward",
}
_KNOBS = [replace(k, mode=_TRIALS[k.id][0], param=_TRIALS[k.id][1], outside=_TRIALS[k.id][2],
                  trial=_HOW.get(k.id, k.trial))
          if k.id in _TRIALS else replace(k, outside=k.outside or "no trial is defined for this knob")
          for k in _KNOBS]

KNOBS: dict[str, Knob] = {k.id: k for k in _KNOBS}


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"dataloader.workers=4"`` -> ``("dataloader.workers", 4)``; ``"amp.bf16"`` -> ``("amp.bf16",
    None)``. Raises ValueError with one sentence for an unknown id or a bad value."""
    text = spec.strip()
    kid, eq, val = text.partition("=")
    kid = kid.strip()
    k = KNOBS.get(kid)
    if k is None:
        close = [i for i in KNOBS if kid and (kid in i or i in kid)]
        raise ValueError(f"unknown knob {kid!r}" + (f" (did you mean {', '.join(close[:3])}?)" if close else "")
                         + "; `diag try --list` shows every knob")
    if not eq:
        return kid, None
    if k.param is None:
        raise ValueError(f"knob {kid!r} takes no value (give it as {kid})")
    try:
        n = int(val.strip())
    except ValueError:
        raise ValueError(f"knob {kid!r} takes a whole number: {kid}={k.param}, not {text!r}") from None
    if n < 0 or n > 1024:
        raise ValueError(f"knob {kid!r} takes a number from 0 to 1024, not {n}")
    return kid, n


def spec_text(kid: str, value: int | None) -> str:
    return kid if value is None else f"{kid}={value}"


def knob(knob_id: str) -> Knob:
    return KNOBS[knob_id]


def words(knob_id: str, framework: str | None = None, **values: Any) -> tuple[str, str | None, bool]:
    """``(fix, snippet, lever)`` for ``knob_id`` in ``framework``'s words (None or unknown: plain
    PyTorch), templates filled from ``values``. ``lever`` is False when the framework has no setting
    for it (the sentence says what to do instead)."""
    sp = KNOBS[knob_id].spelling(framework if framework in FRAMEWORKS else None)
    return _fmt(sp.fix, values) or "", _fmt(sp.snippet, values), sp.lever


_DOC_VALUES = {"dtype": "bfloat16", "cls": "AdamW", "better": "fused=True"}
# the snippet line a docs cell shows: the one that turns the knob
_DOC_TOKENS = {"amp.bf16": "autocast|bf16", "amp.fp16": "autocast|fp16|16-mixed", "matmul.tf32": "tf32|precision",
               "eval.bf16": "autocast|bf16", "dataloader.workers": "num_workers", "dataloader.pin-memory": "pin_memory",
               "dataloader.persistent-workers": "persistent", "cudnn.benchmark": "benchmark",
               "optim.set-to-none": "zero_grad", "optim.fused": "fused", "compile": "compile|dynamo",
               "compile.cuda-graphs": "reduce-overhead", "train.accumulation": "accum|backward",
               "eval.batch": "batch_size", "eval.inference-mode": "inference_mode",
               "log.interval": "logging|log_every|item", "debug.anomaly": "anomaly",
               "ddp.find-unused": "find_unused|strategy|DDP"}


def markdown() -> str:
    """The table for docs/checks.md: one row per knob, one column per framework (the snippet's
    first line, as the user writes it)."""
    def cell(k: Knob, fw: str) -> str:
        sp = k.words.get(fw)
        if sp is None:
            return "as plain PyTorch"
        lines = [ln.strip() for ln in (_fmt(sp.snippet, _DOC_VALUES) or "").splitlines() if ln.strip()]
        token = re.compile(_DOC_TOKENS.get(k.id, re.escape(k.id.split(".")[-1])), re.I)
        code = [ln for ln in lines if token.search(ln)] or lines
        code = [c.split("   #")[0].rstrip() for c in code]
        text = f"`{code[0]}`" if code and sp.lever else ""
        if not sp.lever:
            text = "no setting: " + (f"`{code[0]}`" if code else sp.fix)
        return text.replace("|", "\\|") or sp.fix.replace("|", "\\|")

    lines = ["## Knobs: one fix, four vocabularies", "",
             "Every fix that is a setting is a knob (`diag/knobs.py`), worded for the framework the run used "
             "(`RankEvidence.framework`). `N` stands for the number the finding computes; a cell shows the line "
             "that turns the knob (the finding's snippet has the rest). \"no setting\": the framework has none, "
             "the finding says what to do instead.", "",
             "| knob | when | plain PyTorch | Hugging Face Trainer | Lightning | Accelerate | checks |",
             "|---|---|---|---|---|---|---|"]
    for k in _KNOBS:
        lines.append(f"| **`{k.id}`** | {k.applies} | " + " | ".join(cell(k, fw) for fw in FRAMEWORKS)
                     + " | " + ", ".join(f"`{c}`" for c in k.checks) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["FRAMEWORKS", "FRAMEWORK_NAMES", "KNOBS", "Knob", "Spelling", "knob", "words", "markdown", "parse_spec",
           "spec_text"]
