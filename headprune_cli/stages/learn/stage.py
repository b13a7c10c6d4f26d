"""The `learn` stage: a checkpoint -> a pruned checkpoint, by learned gates, and the gate scores.

Hard-concrete gates on heads (and with --gate-ffn/--gate-layers on FFN neurons and whole
layers) train with the model under one budget; they close as `select` would choose from
their open probabilities, the last steps train the closed model, and the closed units are
cut (learn.py, gates.py). The loop is the shared training loop (stages/training), with the
options it reads declared there once; this module holds learned pruning's own options,
what it checks before the slow parts, and the run. torch loads inside `run`.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from headprune_cli.artifacts.schema import dumps, write_artifact
from headprune_cli.errors import UsageError
from headprune_cli.files.io import sha256_bytes
from headprune_cli.files.outputs import check_distinct, check_output
from headprune_cli.files.staged import published_together
from headprune_cli.runtime.device import check as check_device
from headprune_cli.stages.budget import Budget, block_params
from headprune_cli.stages.learn.learn import check_learning, close_gates, make_gates
from headprune_cli.stages.options import (
    BudgetOptions,
    LearningRate,
    LoraOptions,
    ShapeOptions,
    Share,
    TokenOptions,
    TrainFilesOptions,
    TrainingOptions,
)
from headprune_cli.stages.training import run as training
from headprune_cli.stages.unit import Context, Result, Stage, option


class LearnOptions(TrainFilesOptions, TrainingOptions, TokenOptions, LoraOptions, BudgetOptions, ShapeOptions):
    gate_ffn: bool = option(False, "Gate every FFN neuron too, under the same cost budget (a --target-*, not --ratio).")
    gate_layers: bool = option(
        False,
        "Gate every whole layer too (a closed layer is dropped), under the same cost budget "
        "(a --target-*, not --ratio).",
    )
    gates_out: Path | None = option(
        None, "Also write the final gate open probabilities as a scores JSON (method `learned`)."
    )
    gate_lr: LearningRate = option(0.3, "Adam rate of the gate logits and of the Lagrange multipliers.", ge=0.0)
    # Lab notes of rounds one to four (docs/experiments), §21: a target that rises over the first
    # half of the gate phase and is held for the second half, with 60% of the steps for the gates,
    # reaches the target before the gates close (a 20% rise and a 20% hold reached 0.73 of 0.85).
    gate_warmup: Share = option(
        0.5,
        "Share of the gate phase (the steps before the gates close) over which the target "
        "rises from 0; it is held at the target for the rest.",
        ge=0.0,
        le=1.0,
    )
    closed_share: Share = option(
        0.4,
        "Share of the last steps trained with the gates closed (the cut model recovers).",
        ge=0.0,
        le=1.0,
    )
    # The same notes, §21: 0.01 (one more head's worth of gate steps at 72 heads) lost
    # 0.4-0.6 points less than 0.02 on both Debian classifiers at --ratio 0.85.
    gate_tolerance: Share = option(
        0.01,
        "How far (as a share of the budget) the expected share removed may be from the target "
        "when the gates close; further, the gate phase goes on (--gate-extra-steps), then the run refuses.",
        ge=0.0,
        le=1.0,
    )
    gate_extra_steps: int = option(50, "At most this many extra gate-phase steps to reach the --gate-tolerance.", ge=0)

    def budget(self) -> Budget:
        """The one budget the gates aim at (check() refuses none or several)."""
        return self.budgets()[0]

    def hidden(self) -> float:
        """--hidden-weight, or its default: on with a teacher (CoFi distils layers too)."""
        if self.hidden_weight is not None:
            return self.hidden_weight
        return 1.0 if self.teacher is not None else 0.0

    def check(self) -> None:
        """The option combinations learned pruning refuses."""
        flags = ("gate_ffn", "min_ffn", "ffn_multiple_of")
        check_learning(self.budgets(), [f for f in flags if getattr(self, f) != LearnOptions.model_fields[f].default])
        self.check_lora()
        if self.keep_adapter is not None:
            raise UsageError("--keep-adapter: learn cuts the model after training; the adapter would not fit it")


def run(opts: LearnOptions, ctx: Context) -> Result:
    with published_together():  # the gate scores appear with the checkpoint, or neither does
        return _run(opts, ctx)


def _run(opts: LearnOptions, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load, save  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)

    opts.check()
    if setup().active:
        raise UsageError("learn runs in one process; start it without torchrun")
    constraints = opts.constraints()
    inputs = [opts.checkpoint, opts.data, opts.eval_data, opts.teacher]
    check_output(opts.output, opts.force, inputs)
    if opts.gates_out is not None:
        check_output(opts.gates_out, opts.force, inputs)
    check_device(opts.device, opts.dtype)
    check_distinct([opts.output, *filter(None, [opts.gates_out])])
    model = load(opts.checkpoint)
    lr = training.chosen_lr(opts, model)  # before the adapters join the model's parameters
    adapted = training.attach_lora(opts, model)
    teacher = training.teacher_of(opts.teacher, opts.checkpoint, model, root_teaches_itself=True)
    train, dev = training.read_sets(opts, model)
    cfg = training.loop_config(opts, lr, opts.hidden())  # no training state: the gates' is not saved
    gates = make_gates(
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
    result = training.run_training(model, train, cfg, dev, teacher, ctx=ctx, gating=gates, name="learn")
    if adapted is not None:
        result.model = training.merge_lora(adapted, None, opts.output, ctx)
    closed = _close(opts, result.model, gates, constraints, len(train), ctx)
    result.gates = closed.report
    save(result.model.to("cpu"), opts.output, plan_sha=sha256_bytes(dumps(closed.plan).encode()), overwrite=opts.force)
    ctx.print(f"wrote {opts.output}")
    if opts.gates_out is not None:
        write_artifact(closed.scores, opts.gates_out)
        ctx.print(f"wrote {opts.gates_out}")
    return Result([str(opts.output), *([str(opts.gates_out)] if opts.gates_out else [])], value=result)


def _close(opts: LearnOptions, model, gates, constraints, samples: int, ctx: Context):
    """Close the learned gates and cut the closed units out of `model` (in place)."""
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
        "hidden_weight": opts.hidden(),
        "gate_ffn": opts.gate_ffn,
        "gate_layers": opts.gate_layers,
        "ratio": opts.ratio,
        "target_params": opts.target_params,
        "target_flops": opts.target_flops,
        **block_params(opts.target_block_params),
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
        samples=samples,
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


# `headprune learn --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Prune by learned gates: hard-concrete gates train with the model under one budget, then the closed heads, neurons and layers are cut.

    Gates on the heads (whole KV groups for GQA models), and with a FLOPs/params target on every FFN neuron (--gate-ffn) and every whole layer (--gate-layers), train with the model under the one budget (--ratio, --target-params, --target-flops or --target-block-params); a Lagrangian (CoFi) drives the expected share removed to the target, which rises from 0 over --gate-warmup of the gate phase (the first 1 - --closed-share of the steps) and is then held. At the closing step, an expected share further than --gate-tolerance from the target trains up to --gate-extra-steps more gate steps, then refuses (nothing written). The gates then close as `headprune select` would choose from their open probabilities (with --min-heads, --multiple-of, --protect, --uniform, --min-ffn, --ffn-multiple-of; layers open with probability below 0.5 are dropped), the last --closed-share of the steps trains the model with them closed, and the output is the physically cut model. With a teacher, --hidden-weight (default 1 here) adds layer distillation: each block's output against the teacher's. --gates-out writes the open probabilities as scores (method `learned`) with the gates' report (expected vs target vs lambdas per step, expected vs closed share) under config.gates. --teacher auto on an unpruned model distils from the model itself. The training options are finetune's (--steps, --lr, --kd-weight, --lora, ...); not resumable, one process. Recover further with `headprune finetune`.

    Examples:

      headprune learn model.safetensors --data train.jsonl --ratio 0.5 --teacher auto --gates-out gates.json -o small.safetensors

      headprune learn model.safetensors --data train.jsonl --ratio 0.85 --teacher auto --gate-warmup 0.5 --gate-tolerance 0.01 --gate-extra-steps 50 -o small.safetensors

      headprune learn model.safetensors --data train.jsonl --target-flops 0.5 --gate-ffn --gate-layers --teacher auto -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "learn",
    LearnOptions,
    run,
    stem="learned",
    inputs={"checkpoint": ("model",), "data": ("train_data",), "eval_data": ("eval_data",)},
    outputs={"output": "{stem}.safetensors"},
    makes={"model": "output"},
    needs=("checkpoint", "data"),
    optional_outputs={"gates_out": "{stem}.gates.json"},
    help=HELP,
)
