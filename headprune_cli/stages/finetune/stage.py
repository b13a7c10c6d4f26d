"""The `finetune` stage: a (pruned) checkpoint -> a recovered checkpoint of the same shape.

Recovery only: full training, LoRA, FSDP, distillation, resume, head dropout and lottery
rewinding; it never changes which heads, neurons or layers the model has (learned-gate
pruning is the `learn` stage). The options are the training loop's (training/options.py)
plus recovery's own; what the stage checks before the slow parts, and the run around the
loop (training/run.py). torch and the checkpoint code load inside `run`.
"""

from __future__ import annotations

import math
from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_distinct, check_folder, check_output, remove_folder
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import dtype_name
from headprune_cli.stages.training import run as training
from headprune_cli.stages.training.options import TrainingOptions
from headprune_cli.stages.unit import Context, Result, Stage, option

# The options of learned-gate pruning, which `finetune --learn-gates` took before it was a
# stage of its own: given to finetune, they are refused with a line naming `learn`.
MOVED_TO_LEARN = (
    "learn_gates",
    "ratio",
    "target_params",
    "target_flops",
    "min_heads",
    "multiple_of",
    "protect",
    "uniform",
    "gate_ffn",
    "gate_layers",
    "min_ffn",
    "ffn_multiple_of",
    "gates_out",
    "gate_lr",
    "gate_warmup",
    "closed_share",
    "gate_tolerance",
    "gate_extra_steps",
)


class FinetuneOptions(TrainingOptions):
    rewind_to: Path | None = option(
        None,
        "Lottery ticket: before training, give the kept heads, FFN neurons and layers the weights they have in this "
        "checkpoint (a headprune checkpoint or a Hugging Face folder of the same architecture, e.g. the pre-trained "
        "base), by original index; tensors it lacks keep CKPT's values.",
    )
    reinit: int | None = option(
        None,
        "Lottery-ticket control: before training, re-initialise the kept structure (the model's own init), seeded.",
    )
    state_dir: Path | None = option(
        None,
        "Training-state folder (default OUT.state); removed after success; a new, empty or headprune-made folder.",
        folder=True,
    )
    save_every: int = option(50, "Save the training state every N steps.", ge=1)
    resume: bool = option(False, "Continue from the saved training state.")
    head_dropout: float = option(
        0.0, "Pruning-aware training: drop each head's output with probability P per example (unscaled), in [0, 1)."
    )
    keep_adapter: Path | None = option(
        None,
        "--lora: also write the unmerged adapter here, in peft's format (a folder; applies to CHECKPOINT).",
        folder=True,
    )
    fsdp: bool = option(
        False,
        "Under torchrun: shard weights, gradients, AdamW state and the teacher over the processes "
        "(FSDP2, one unit per block) instead of a full copy in each; the state is saved sharded and resumes "
        "with the same process count.",
    )

    def check(self) -> None:
        """The option combinations recovery refuses."""
        if not (math.isfinite(self.head_dropout) and 0.0 <= self.head_dropout < 1.0):
            raise UsageError(
                f"--head-dropout {self.head_dropout} is outside [0, 1) (the probability of dropping a head)"
            )
        if self.keep_adapter is not None and not self.lora:
            raise UsageError("--keep-adapter writes the LoRA adapter; it needs --lora")
        self.check_lora()
        if self.rewind_to is not None and self.reinit is not None:
            raise UsageError("--rewind-to and --reinit both reset the weights; give one of them")


def run(opts: FinetuneOptions, ctx: Context) -> Result:
    from headprune_cli.model.checkpoint import load, save  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.runtime.distributed import setup  # noqa: PLC0415 (keeps torch out of this module's import)

    opts.check()
    if opts.fsdp:
        from headprune_cli.stages.training.sharding import check_fsdp  # noqa: PLC0415 (keeps torch out of this module's import)

        check_fsdp(setup(), opts.lora)
    # `auto` reaches the root through the checkpoint's provenance
    inputs = [opts.checkpoint, opts.data, opts.eval_data, opts.teacher, opts.rewind_to]
    check_output(opts.output, opts.force, inputs)
    if opts.keep_adapter is not None:
        from headprune_cli.stages.training.lora import check_adapter_folder  # noqa: PLC0415 (keeps torch out of this module's import)

        check_adapter_folder(opts.keep_adapter, opts.force, inputs)
    check_device(opts.device, opts.dtype)
    state_dir = check_folder(
        opts.state_dir or opts.output.with_name(opts.output.name + ".state"), inputs, "--state-dir"
    )
    check_distinct(
        [opts.output, state_dir, *filter(None, [opts.keep_adapter])]
    )  # the state folder is deleted at the end
    model = load(opts.checkpoint)
    reset = _reset_weights(opts, model, ctx)
    lr = training.chosen_lr(opts, model)  # before the adapters join the model's parameters
    adapted = training.attach_lora(opts, model)
    teacher = training.teacher_of(opts.teacher, opts.checkpoint, model)
    train, dev = training.read_sets(opts, model)
    cfg = training.loop_config(
        opts,
        lr,
        opts.hidden_weight or 0.0,
        resume=opts.resume,
        save_every=opts.save_every,
        state_dir=state_dir,
        fsdp=opts.fsdp,
    )
    result = training.run_training(
        model, train, cfg, dev, teacher, _fingerprint(opts, model, cfg, reset), ctx, _gating(opts, model)
    )
    if adapted is not None:
        result.model = training.merge_lora(adapted, opts.keep_adapter, ctx)
    if setup().main:
        save(result.model.to("cpu"), opts.output, plan_sha=None, overwrite=opts.force)
        remove_folder(state_dir)
        ctx.print(f"wrote {opts.output}")
    setup().barrier()
    outputs = [str(opts.output)] + ([str(opts.keep_adapter)] if opts.keep_adapter is not None else [])
    return Result(outputs, value=result)


def _fingerprint(opts: FinetuneOptions, model, cfg, reset: str | None) -> dict:
    """What a saved training state must match to be resumed."""
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
    return fingerprint


def _reset_weights(opts: FinetuneOptions, model, ctx: Context) -> str | None:
    """--rewind-to / --reinit (lottery tickets), before anything trains; what was done, for the fingerprint."""
    if opts.reinit is not None:
        from headprune_cli.stages.finetune.rewind import reinit  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

        reinit(model, opts.reinit)
        ctx.print(f"re-initialised every kept weight (the model's own init, seed {opts.reinit})")
        return f"reinit {opts.reinit}"
    if opts.rewind_to is None:
        return None
    from headprune_cli.stages.finetune.rewind import rewind  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    done = rewind(model, opts.rewind_to)
    ctx.print(done.summary(model.headprune.provenance.get("root")), soft_wrap=True, markup=False)
    return f"rewind {done.sha256}"


def _gating(opts: FinetuneOptions, model):
    """Head dropout's gates on the training forward passes, or none."""
    if not opts.head_dropout:
        return None
    from headprune_cli.stages.training.gating import HeadDropout  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    return HeadDropout(model, opts.head_dropout, opts.seed)


STAGE = Stage(
    "finetune",
    FinetuneOptions,
    run,
    stem="finetuned",
    inputs={"checkpoint": ("model",), "data": ("train_data",), "eval_data": ("eval_data",)},
    outputs={"output": "{stem}.safetensors"},
    makes={"model": "output"},
    needs=("checkpoint", "data"),
    refused={
        "keep_adapter": (
            "the pipeline keeps the merged checkpoint; "
            "run `headprune finetune --lora --keep-adapter DIR` for peft's adapter folder"
        )
    },
    moved={name: "learn" for name in MOVED_TO_LEARN},
)
