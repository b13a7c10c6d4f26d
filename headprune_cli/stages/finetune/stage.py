"""The `finetune` stage: a (pruned) checkpoint -> a recovered checkpoint.

The options, what the stage checks before the slow parts, and the display while it
trains: a progress bar (loss, lr, metric) and a summary table on the context's console
(stderr), so that `headprune finetune` and a pipeline's finetune stage show the same.
torch and the checkpoint code load inside `run`: the options are read without them.
"""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from headprune_cli.artifacts.schema import dumps, write_artifact
from headprune_cli.errors import UsageError
from headprune_cli.files.io import sha256_bytes
from headprune_cli.files.outputs import check_distinct, check_folder, check_output, remove_folder
from headprune_cli.files.staged import published_together
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import dtype_name
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.finetune.learn import check_learning, close_gates, make_gates
from headprune_cli.stages.options import (
    BudgetOptions,
    Finite,
    LearningRate,
    LoraOptions,
    RecoveryOptions,
    Seed,
    ShapeOptions,
    Share,
    TokenOptions,
)
from headprune_cli.stages.unit import Context, Result, Stage, option


class FinetuneOptions(RecoveryOptions, TokenOptions, LoraOptions, BudgetOptions, ShapeOptions):
    checkpoint: Path = option(..., "The (pruned) checkpoint to recover.", argument=True)
    data: Path = option(..., "Training data (JSONL/CSV/text/safetensors).")
    output: Path = option(..., "Where to write the recovered checkpoint.", "-o", "--output")
    eval_data: Path | None = option(None, "Dev set: evaluated every epoch; the best epoch is kept.")
    teacher: str | None = option(None, "Distil from this checkpoint, or `auto` = the root model in CKPT's provenance.")
    rewind_to: Path | None = option(
        None,
        "Lottery ticket: before training, give the kept heads, FFN neurons and layers the weights they have in this "
        "checkpoint (a headprune checkpoint or a Hugging Face folder of the same architecture, e.g. the pre-trained "
        "base), by original index; tensors it lacks keep CKPT's values.",
    )
    reinit: Seed | None = option(
        None,
        "Lottery-ticket control: before training, re-initialise the kept structure (the model's own init), seeded.",
    )
    force: bool = option(False, "Overwrite OUT if it exists.")
    head_dropout: Finite = option(
        0.0, "Pruning-aware training: drop each head's output with probability P per example (unscaled), in [0, 1)."
    )
    learn_gates: bool = option(
        False,
        "Learned pruning: train hard-concrete head gates (KV groups for GQA) "
        "with the model towards --ratio/--target-*, then cut the closed heads.",
    )
    gate_ffn: bool = option(
        False, "--learn-gates: gate every FFN neuron too, under the same --target-flops/--target-params budget."
    )
    gate_layers: bool = option(
        False,
        "--learn-gates: gate every whole layer too (a closed layer is dropped), under the same "
        "--target-flops/--target-params budget.",
    )
    gates_out: Path | None = option(
        None, "--learn-gates: also write the final gate open probabilities as a scores JSON (method `learned`)."
    )
    gate_lr: LearningRate = option(
        0.3, "--learn-gates: Adam rate of the gate logits and of the Lagrange multipliers.", ge=0.0
    )
    # BENCHMARKS.md section 21: a target that rises over the first half of the gate phase and is
    # held for the second half, with 60% of the steps for the gates, reaches the target before
    # the gates close (section 15: a 20% rise and a 20% hold reached 0.73 of an 0.85 target).
    gate_warmup: Share = option(
        0.5,
        "--learn-gates: share of the gate phase (the steps before the gates close) over which the target "
        "rises from 0; it is held at the target for the rest.",
        ge=0.0,
        le=1.0,
    )
    closed_share: Share = option(
        0.4,
        "--learn-gates: share of the last steps trained with the gates closed (the cut model recovers).",
        ge=0.0,
        le=1.0,
    )
    # BENCHMARKS.md section 21: 0.01 (one more head's worth of gate steps at 72 heads) lost 0.4-0.6 points
    # less than 0.02 on both Debian classifiers at --ratio 0.85.
    gate_tolerance: Share = option(
        0.01,
        "--learn-gates: how far (as a share of the budget) the expected share removed may be from the target "
        "when the gates close; further, the gate phase goes on (--gate-extra-steps), then the run refuses.",
        ge=0.0,
        le=1.0,
    )
    gate_extra_steps: int = option(
        50, "--learn-gates: at most this many extra gate-phase steps to reach the --gate-tolerance.", ge=0
    )

    def budget(self) -> Budget | None:
        found = self.budgets()
        return found[0] if len(found) == 1 else None

    def constraints_given(self) -> list[str]:
        """The learned-pruning options set without --learn-gates (check_learning refuses them)."""
        return self.shape_given() + [name for name in ("gate_ffn", "gate_layers") if getattr(self, name)]

    def check(self) -> None:
        """The option combinations learned pruning and head dropout refuse."""

        gates_out = ["gates_out"] if self.gates_out else []
        check_learning(
            self.learn_gates, self.budgets(), self.head_dropout, self.resume, self.constraints_given() + gates_out
        )
        _check_lora_options(self)
        if self.rewind_to is not None and self.reinit is not None:
            raise UsageError("--rewind-to and --reinit both reset the weights; give one of them")


def run(opts: FinetuneOptions, ctx: Context) -> Result:
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.runtime.faults import peer_faults  # noqa: PLC0415 (keeps torch out of this module's import)

    setup()  # a bad torchrun environment is refused before anything is read
    # --keep-adapter's folder is published with the output, or removed when the run fails.
    with peer_faults(opts.state_dir or opts.output.with_name(opts.output.name + ".state")), published_together():
        return _run(opts, ctx)


def _run(opts: FinetuneOptions, ctx: Context) -> Result:
    from headprune_cli.data.readers import read_data  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.checkpoint import load, save  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.finetune.losses import check_labels  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    opts.check()
    if opts.fsdp:
        from headprune_cli.stages.finetune.sharding import check_fsdp  # noqa: PLC0415 (keeps torch out of this module's import)

        check_fsdp(setup(), opts.lora, opts.learn_gates)
    constraints = opts.constraints()
    inputs = [
        opts.checkpoint,
        opts.data,
        opts.eval_data,
        opts.teacher,
        opts.rewind_to,
    ]  # `auto` reaches the root through the checkpoint's provenance
    check_output(opts.output, opts.force, inputs)
    if opts.gates_out is not None:
        check_output(opts.gates_out, opts.force, inputs)
    if opts.keep_adapter is not None:
        from headprune_cli.stages.finetune.lora import check_adapter_folder  # noqa: PLC0415 (keeps torch out of this module's import)

        check_adapter_folder(opts.keep_adapter, opts.force, inputs)
    check_device(opts.device, opts.dtype)
    state_dir = check_folder(
        opts.state_dir or opts.output.with_name(opts.output.name + ".state"), inputs, "--state-dir"
    )
    check_distinct(
        [opts.output, state_dir, *([opts.gates_out] if opts.gates_out else []), *filter(None, [opts.keep_adapter])]
    )  # the state folder is deleted at the end
    model = load(opts.checkpoint)
    reset = _reset_weights(opts, model, ctx)
    lr = chosen_lr(opts, model)  # before the adapters join the model's parameters
    adapted = _attach_lora(opts, model)
    teacher = _teacher(opts.teacher, opts.checkpoint, model, root_teaches_itself=opts.learn_gates)
    train = read_data(opts.data, model, max_length=opts.max_length, seed=opts.seed)
    dev = read_data(opts.eval_data, model, max_length=opts.max_length) if opts.eval_data is not None else None
    if dev is not None:
        check_labels(model, {"labels": dev.labels} if dev.labels is not None else {}, f"{opts.eval_data}")
    # The options are what training reads, with the defaults that depend on the model resolved.
    cfg = opts.model_copy(
        update={
            "lr": lr,
            "hidden_weight": _hidden_weight(opts),
            "state_dir": None if opts.learn_gates else state_dir,  # gates are not resumable
        }
    )
    fingerprint = {
        "checkpoint": model.headprune.loaded_from[1],
        "data": str(opts.data),
        "teacher": opts.teacher,
        "epochs": opts.epochs,
        "steps": opts.steps,
        "dtype": dtype_name(opts.dtype),
    }  # a saved state resumes only in the dtype it was trained in
    if reset is not None:
        fingerprint["reset"] = reset  # a state saved after one reset never resumes another
    if opts.head_dropout:
        fingerprint["head_dropout"] = opts.head_dropout
    if cfg.hidden_weight:
        fingerprint["hidden_weight"] = cfg.hidden_weight  # a resumed run must distil the layers as it began
    if opts.lora:
        fingerprint["lora"] = opts.lora_spec().fingerprint()
    if opts.fsdp:
        fingerprint["fsdp"] = True
    if opts.autocast:
        fingerprint["autocast"] = True
    gating = _gating(opts, model, constraints)
    result = run_finetune(model, train, cfg, dev, teacher, fingerprint, ctx, gating=gating)
    if adapted is not None:
        result.model = _merge_lora(opts, adapted, ctx)
    closed = _close(opts, result.model, gating, constraints, train, ctx) if opts.learn_gates else None
    result.gates = None if closed is None else closed.report
    if setup().main:
        plan_sha = None if closed is None else sha256_bytes(dumps(closed.plan).encode())
        save(result.model.to("cpu"), opts.output, plan_sha=plan_sha, overwrite=opts.force)
        if cfg.state_dir is not None:
            remove_folder(cfg.state_dir)
        ctx.print(f"wrote {opts.output}")
        if closed is not None and opts.gates_out is not None:
            write_artifact(closed.scores, opts.gates_out)
            ctx.print(f"wrote {opts.gates_out}")
    setup().barrier()
    outputs = [str(opts.output), *([str(opts.gates_out)] if closed is not None and opts.gates_out else [])]
    outputs += [str(opts.keep_adapter)] if opts.keep_adapter is not None else []
    return Result(outputs, value=result)


def _check_lora_options(opts: FinetuneOptions) -> None:
    opts.check_lora()
    if opts.keep_adapter is not None and opts.learn_gates:
        raise UsageError("--keep-adapter with --learn-gates: the adapter would not fit the cut model; drop one of them")


def _reset_weights(opts: FinetuneOptions, model, ctx: Context) -> str | None:
    """--rewind-to / --reinit (lottery tickets), before anything trains; what was done, for the fingerprint."""
    if opts.rewind_to is None and opts.reinit is None:
        return None
    from headprune_cli.stages.finetune.rewind import reinit, rewind  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if opts.reinit is not None:
        reinit(model, opts.reinit)
        ctx.print(f"re-initialised every kept weight (the model's own init, seed {opts.reinit})")
        return f"reinit {opts.reinit}"
    done = rewind(model, opts.rewind_to)
    ctx.print(done.summary(model.headprune.provenance.get("root")), soft_wrap=True, markup=False)
    return f"rewind {done.sha256}"


def chosen_lr(opts: FinetuneOptions, model) -> float | None:
    """--lr; else with --lora, LORA_LR_FACTOR x full training's default (adapters start at zero
    and move a few parameters, so they take larger steps); else None: train.py's default_lr."""
    if opts.lr is not None or not opts.lora:
        return opts.lr
    from headprune_cli.stages.finetune.lora import LORA_LR_FACTOR  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.finetune.train import default_lr  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    return LORA_LR_FACTOR * default_lr(model)


def _attach_lora(opts: FinetuneOptions, model):
    """With --lora: the PeftModel around `model` (adapted in place), else None."""
    if not opts.lora:
        return None
    from headprune_cli.stages.finetune.lora import attach  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    return attach(model, opts.lora_spec(), opts.seed)


def _merge_lora(opts: FinetuneOptions, adapted, ctx: Context):
    """--keep-adapter's folder first (rank 0), then the adapters merged into the dense weights."""
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.finetune.lora import merge, save_adapter  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if opts.keep_adapter is not None and setup().main:
        save_adapter(adapted, opts.keep_adapter)
        ctx.print(f"adapter ready: {opts.keep_adapter} appears with {opts.output}")
    return merge(adapted)


def _gating(opts: FinetuneOptions, model, constraints):
    """The gates of the training forward passes: learned, head dropout, or none."""
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.finetune.gates import HeadDropout  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if opts.learn_gates:
        if setup().active:
            raise UsageError("--learn-gates runs in one process; start it without torchrun")
        return make_gates(
            model,
            opts.budget(),
            constraints,
            seed=opts.seed,
            seq_len=opts.max_length,
            lr=opts.gate_lr,
            warmup=opts.gate_warmup,
            closed_share=opts.closed_share,
            tolerance=opts.gate_tolerance,
            extra_steps=opts.gate_extra_steps,
            ffn=opts.gate_ffn,
            layers=opts.gate_layers,
        )
    return HeadDropout(model, opts.head_dropout, opts.seed) if opts.head_dropout else None


def _close(opts: FinetuneOptions, model, gates, constraints, train, ctx: Context):
    """Close the learned gates and cut the closed heads out of `model` (in place)."""
    from headprune_cli.stages.objectives import default_objective  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.prune.cut import cut  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    config = {
        "method": "learned",
        "seed": opts.seed,
        "gate_lr": opts.gate_lr,
        "gate_warmup": opts.gate_warmup,
        "closed_share": opts.closed_share,
        "gate_tolerance": opts.gate_tolerance,
        "gate_extra_steps": opts.gate_extra_steps,
        "hidden_weight": _hidden_weight(opts),
        "gate_ffn": opts.gate_ffn,
        "gate_layers": opts.gate_layers,
        "ratio": opts.ratio,
        "target_params": opts.target_params,
        "target_flops": opts.target_flops,
        "kd_weight": opts.kd_weight,
        "teacher": opts.teacher,
    }
    closed = close_gates(
        model,
        gates,
        constraints,
        opts.budget(),
        checkpoint=opts.checkpoint,
        data=opts.data,
        max_length=opts.max_length,
        objective=default_objective(model),
        samples=len(train),
        config=config,
    )
    report = closed.report
    ctx.print(gate_table(report))
    ctx.print(
        f"learned gates: expected share removed {report['expected_at_close']:.3f} when they closed at step "
        f"{report['closed_at_step']} ({report['extra_steps']} extra), closed {report['closed']:.3f} "
        f"(target {report['target']:.3f}, {report['budget']}); closed {_closed_units(report)}"
    )
    cut(model, closed.selection)
    return closed


def _closed_units(report: dict) -> str:
    """'40 of 72 heads, 4096 of 9216 FFN neurons, 1 of 6 layers': what the closing removed (the
    heads and neurons of a dropped layer count as closed)."""
    names = {"heads": "heads", "neurons": "FFN neurons", "layers": "layers"}
    return ", ".join(f"{u['closed']} of {u['of']} {names[kind]}" for kind, u in report["units"].items())


def gate_table(report: dict, rows: int = 10):
    """The gate phase at about `rows` evenly spaced steps: expected share vs target vs the multipliers."""
    trace = report["trace"]
    table = Table(title="learned gates: expected share removed vs target")
    for column in ["step", "expected", "target", "lambda1", "lambda2"]:
        table.add_column(column, justify="right")
    picks = sorted({round(i * (len(trace) - 1) / max(1, rows - 1)) for i in range(rows)}) if trace else []
    for r in (trace[i] for i in picks):
        table.add_row(
            str(r["step"]),
            f"{r['expected_sparsity']:.3f}",
            f"{r['target']:.3f}",
            f"{r['lambda1']:.3f}",
            f"{r['lambda2']:.3f}",
        )
    return table


def _hidden_weight(opts: FinetuneOptions) -> float:
    """--hidden-weight, or its default: on for learned gates with a teacher (CoFi distils layers too)."""
    if opts.hidden_weight is not None:
        return opts.hidden_weight
    return 1.0 if opts.learn_gates and opts.teacher is not None else 0.0


def _teacher(spec: str | None, checkpoint: Path, student, root_teaches_itself: bool = False):
    from headprune_cli.stages.finetune.distill import load_teacher, resolve_teacher  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    path = resolve_teacher(spec, checkpoint, root_teaches_itself)
    return load_teacher(path, student) if path is not None else None


def run_finetune(model, train, cfg, dev=None, teacher=None, fingerprint=None, ctx: Context | None = None, gating=None):
    """finetune() on the model's own objective, evaluated on `dev` after every epoch,
    with a progress bar and a summary table on `ctx`'s console (the main process only;
    no bar when ctx.progress is False). Returns the FinetuneResult."""
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.finetune.train import finetune, validate  # noqa: PLC0415 (keeps numpy, safetensors, torch, transformers out of this module's import)
    from headprune_cli.stages.objectives import default_objective, evaluate  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    ctx = ctx or Context()
    objective = default_objective(model)
    eval_fn = None
    if dev is not None:

        def eval_fn(m):
            return {x.name: x.value for x in evaluate(m, dev, objective, reference=teacher)}

    validate(model, train, cfg, teacher)  # errors before the progress bar appears
    main = setup().main
    with _progress(ctx.console, show=main and ctx.progress) as bar:
        task = bar.add_task("finetune", total=None, loss="", metric="")

        def on_step(step, total, loss, rate):
            bar.update(task, completed=step, total=total, loss=f"loss {loss:.4f}  lr {rate:.2e}")

        def on_epoch(record):
            if record.metrics:
                name, value = next(iter(record.metrics.items()))
                bar.update(task, metric=f"{name} {value:.4f} (epoch {record.epoch})")

        # The direction of the first metric (which epoch is best) comes from its name.
        result = finetune(
            model,
            train,
            cfg,
            eval_fn,
            teacher=teacher,
            on_step=on_step,
            on_epoch=on_epoch,
            fingerprint=fingerprint,
            gating=gating,
        )
    if main:
        ctx.print(summary_table(result))
    return result


class _LazyProgress(Progress):
    """A bar drawn from its first update on: a refusal before training starts (a resume state
    saved under other settings) stays the one `Error:` line on stderr."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.live.is_started:  # stopping prints a newline on a non-terminal stderr
            self.stop()

    def update(self, *args, **kwargs) -> None:
        if not self.live.is_started and not self.disable:
            self.start()
        super().update(*args, **kwargs)

    def refresh(self) -> None:
        if self.live.is_started:  # before, a refresh would print an empty line
            super().refresh()


def _progress(console, show: bool):

    return _LazyProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"),
        TextColumn("{task.fields[metric]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
        transient=False,
    )


def summary_table(result):
    """Epoch, step, train loss, the dev metrics and which epoch was kept, as a rich Table."""

    names = list(result.history[0].metrics) if result.history and result.history[0].metrics else []
    table = Table(title=f"finetune: {result.steps} steps, lr {result.lr:g}, kd weight {result.kd_weight:g}")
    for column in ["epoch", "step", "train loss", *names, "kept"]:
        table.add_column(column, justify="right")
    for r in result.history:
        loss = "-" if r.train_loss is None else f"{r.train_loss:.4f}"
        kept = "best" if r.epoch == result.best_epoch else ""
        table.add_row(str(r.epoch), str(r.step), loss, *(f"{r.metrics.get(n, float('nan')):.4f}" for n in names), kept)
    return table


# `headprune finetune --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Recover quality after pruning: AdamW with warmup and linear decay, on the checkpoint's own objective, optionally distilling from the unpruned model.

    Loss with a teacher: (1 - a) * task + a * T^2 * KL(softmax(teacher/T) || softmax(student/T)); embedding models match the teacher's embeddings (1 - cosine). The output is written atomically at the end; the training state is saved every --save-every steps, and --resume continues from it with the same final weights as an uninterrupted run. Runs unchanged under torchrun (data parallel; --batch-size stays global).

    Examples:

      headprune finetune small.safetensors --data train.jsonl --eval-data dev.jsonl --epochs 3 -o small-ft.safetensors

      headprune finetune small.safetensors --data train.jsonl --teacher auto --kd-weight 0.5 -o small-kd.safetensors

      torchrun --nproc-per-node 2 -m headprune_cli finetune small.safetensors --data train.jsonl --steps 500 -o out.safetensors

    At LLM scale: --lora trains low-rank adapters (peft) on the attention and FFN projections and merges them into the output (--keep-adapter DIR also writes peft's adapter folder); --fsdp under torchrun shards weights, gradients, AdamW state and the teacher (FSDP2, one unit per block; sharded resumable state); --recompute (default from 400 M parameters) and --autocast cut activation memory.

      headprune finetune llama-pruned.safetensors --data train.txt --teacher auto --lora --lora-rank 16 --keep-adapter adapter -o llama-lora.safetensors

      torchrun --nproc-per-node 8 -m headprune_cli finetune llama-pruned.safetensors --data train.txt --teacher auto --fsdp -o llama-kd.safetensors

    Learned pruning (--learn-gates with --ratio, --target-params or --target-flops): hard-concrete gates on the heads (whole KV groups for GQA models), and with a FLOPs/params target on every FFN neuron (--gate-ffn) and every whole layer (--gate-layers), train with the model under the one budget; a Lagrangian (CoFi) drives the expected share removed to the target, which rises from 0 over --gate-warmup of the gate phase (the first 1 - --closed-share of the steps) and is then held. At the closing step, an expected share further than --gate-tolerance from the target trains up to --gate-extra-steps more gate steps, then refuses (nothing written). The gates then close as `headprune select` would choose from their open probabilities (with --min-heads, --multiple-of, --protect, --uniform, --min-ffn, --ffn-multiple-of; layers open with probability below 0.5 are dropped), the last --closed-share of the steps trains the model with them closed, and the output is the physically cut model. With a teacher, --hidden-weight (default 1 here) adds layer distillation: each block's output against the teacher's. --gates-out writes the open probabilities as scores (method `learned`) with the gates' report (expected vs target vs lambdas per step, expected vs closed share) under config.gates. --teacher auto on an unpruned model distils from the model itself. Not resumable, one process.

    --head-dropout P zeroes each head's output with probability P per example while training (not rescaled: the condition a pruned model runs in), so the model becomes robust to removal.

      headprune finetune model.safetensors --data train.jsonl --learn-gates --ratio 0.5 --teacher auto --gates-out gates.json -o small.safetensors

      headprune finetune model.safetensors --data train.jsonl --learn-gates --ratio 0.85 --teacher auto --gate-warmup 0.5 --gate-tolerance 0.01 --gate-extra-steps 50 -o small.safetensors

      headprune finetune model.safetensors --data train.jsonl --learn-gates --target-flops 0.5 --gate-ffn --gate-layers --teacher auto -o small.safetensors

      headprune finetune model.safetensors --data train.jsonl --head-dropout 0.2 -o robust.safetensors

    Lottery tickets: --rewind-to CKPT gives the kept heads, FFN neurons and layers the weights they have in CKPT (a headprune checkpoint or a Hugging Face folder of the same family and shape, typically the pre-trained base the model was fine-tuned from), by the original indices the pruned checkpoint records; tensors CKPT lacks (a classifier, when CKPT is the bare encoder) keep their values and are named. --reinit SEED re-initialises the kept structure with the model's own init instead. Then it trains as usual. The random-heads control: `headprune select --strategy random --seed S`.

      headprune finetune pruned.safetensors --data train.jsonl --teacher auto --rewind-to init-folder/ -o ticket.safetensors

      headprune finetune pruned.safetensors --data train.jsonl --teacher auto --reinit 0 -o reinit.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "finetune",
    FinetuneOptions,
    run,
    stem="finetuned",
    inputs={"checkpoint": ("model",), "data": ("train_data",), "eval_data": ("eval_data",)},
    outputs={"output": "{stem}.safetensors"},
    makes={"model": "output"},
    needs=("checkpoint", "data"),
    optional_outputs={"gates_out": "{stem}.gates.json"},
    refused={
        "keep_adapter": (
            "the pipeline keeps the merged checkpoint; "
            "run `headprune finetune --lora --keep-adapter DIR` for peft's adapter folder"
        )
    },
    help=HELP,
)
