"""The `finetune` stage: a (pruned) checkpoint -> a recovered checkpoint of the same shape.

Recovery only: full training, LoRA, FSDP, distillation, resume, head dropout and lottery
rewinding; it never changes which heads, neurons or layers the model has (learned-gate
pruning is the `learn` stage). The options are the shared groups (stages/options.py) plus
recovery's own; what the stage checks before the slow parts, and the run around the shared
training loop (stages/training/run.py). torch and the checkpoint code load inside `run`.
"""

from __future__ import annotations

import math
from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_distinct, check_folder, check_output, remove_folder
from headprune_cli.files.staged import published_together
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import dtype_name
from headprune_cli.stages.options import Finite, LoraOptions, RecoveryOptions, Seed, TokenOptions, TrainFilesOptions
from headprune_cli.stages.training import run as training
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


class FinetuneOptions(TrainFilesOptions, RecoveryOptions, TokenOptions, LoraOptions):
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
    head_dropout: Finite = option(
        0.0, "Pruning-aware training: drop each head's output with probability P per example (unscaled), in [0, 1)."
    )

    def check(self) -> None:
        """The option combinations recovery refuses."""
        if not (math.isfinite(self.head_dropout) and 0.0 <= self.head_dropout < 1.0):
            raise UsageError(
                f"--head-dropout {self.head_dropout} is outside [0, 1) (the probability of dropping a head)"
            )
        self.check_lora()
        if self.rewind_to is not None and self.reinit is not None:
            raise UsageError("--rewind-to and --reinit both reset the weights; give one of them")


def run(opts: FinetuneOptions, ctx: Context) -> Result:
    from headprune_cli.runtime.distributed import finish, setup  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.runtime.faults import peer_faults  # noqa: PLC0415 (keeps torch out of this module's import)

    setup()  # a bad torchrun environment is refused before anything is read
    # --keep-adapter's folder is published with the output, or removed when the run fails.
    with peer_faults(opts.state_dir or opts.output.with_name(opts.output.name + ".state")), published_together():
        result = _run(opts, ctx)
        finish()
    return result


def _run(opts: FinetuneOptions, ctx: Context) -> Result:
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
    # The options are what training reads, with the defaults that depend on the model resolved.
    cfg = opts.model_copy(update={"lr": lr, "hidden_weight": opts.hidden_weight or 0.0, "state_dir": state_dir})
    fingerprint = _fingerprint(opts, model, cfg, reset)
    result = training.run_training(model, train, cfg, dev, teacher, fingerprint, ctx, _gating(opts, model))
    if adapted is not None:
        result.model = training.merge_lora(adapted, opts.keep_adapter, opts.output, ctx)
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
        "checkpoint": model.headprune.source_sha,
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


# `headprune finetune --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Recover quality after pruning: AdamW with warmup and linear decay, on the checkpoint's own objective, optionally distilling from the unpruned model.

    Recovery keeps the model's shape; learned-gate pruning (formerly --learn-gates) is `headprune learn`.

    Loss with a teacher: (1 - a) * task + a * T^2 * KL(softmax(teacher/T) || softmax(student/T)); embedding models match the teacher's embeddings (1 - cosine). The output is written atomically at the end; the training state is saved every --save-every steps, and --resume continues from it with the same final weights as an uninterrupted run. Runs unchanged under torchrun (data parallel; --batch-size stays global).

    Examples:

      headprune finetune small.safetensors --data train.jsonl --eval-data dev.jsonl --epochs 3 -o small-ft.safetensors

      headprune finetune small.safetensors --data train.jsonl --teacher auto --kd-weight 0.5 -o small-kd.safetensors

      torchrun --nproc-per-node 2 -m headprune_cli finetune small.safetensors --data train.jsonl --steps 500 -o out.safetensors

    At LLM scale: --lora trains low-rank adapters (peft) on the attention and FFN projections and merges them into the output (--keep-adapter DIR also writes peft's adapter folder); --fsdp under torchrun shards weights, gradients and AdamW state (FSDP2, one unit per block; sharded resumable state); a causal LM's teacher is streamed a block at a time; --recompute (default from 400 M parameters, or when a batch outgrows its activation budget) and --autocast cut activation memory.

      headprune finetune llama-pruned.safetensors --data train.txt --teacher auto --lora --lora-rank 16 --keep-adapter adapter -o llama-lora.safetensors

      torchrun --nproc-per-node 8 -m headprune_cli finetune llama-pruned.safetensors --data train.txt --teacher auto --fsdp -o llama-kd.safetensors

    --head-dropout P zeroes each head's output with probability P per example while training (not rescaled: the condition a pruned model runs in), so the model becomes robust to removal.

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
    refused={
        "keep_adapter": (
            "the pipeline keeps the merged checkpoint; "
            "run `headprune finetune --lora --keep-adapter DIR` for peft's adapter folder"
        )
    },
    moved={name: "learn" for name in MOVED_TO_LEARN},
    help=HELP,
)
