"""The option groups several stages share, each option declared here once.

A stage's options model is built from these groups (pydantic mixins) plus its own
fields, and the library receives that options object: no second dataclass mapped by
hand. Numbers are range-checked by their types when the options are read (the command
line, a YAML stage, a Python caller), so a seed torch cannot take or an infinite number
of seconds is refused before any file is read, by one rule for every stage.

Nothing here imports torch: `select --help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationInfo
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticUndefined

from headprune_cli.errors import UsageError
from headprune_cli.model.formats.gguf_grid import grid_ffn_multiple
from headprune_cli.runtime.device import DEVICE_HELP, DTYPE_HELP
from headprune_cli.stages.budget import Budget, checked, given, one_of
from headprune_cli.stages.constraints import Constraints, check_runtime, parse_protect, shape_rules
from headprune_cli.stages.unit import CommaSeparated, Options, comma_list, internal, option

# torch.manual_seed takes 64 bits, but seeds are also combined (seed * 100003 + epoch for the
# data order) and handed to numpy, whose seeds are 32-bit: a seed within 32 bits fits everywhere.
MAX_SEED = 2**32 - 1
MAX_LR = 10.0  # far above any rate that trains (AdamW diverges well before); a typo like 1e308 is refused


def declared(help: str = "", *flags: str, **bounds: Any) -> Any:
    """An option's help, flags and bounds without its default: for `Annotated[T, declared(...)]`
    types that several stages use with defaults of their own. `allow_inf_nan=False` refuses
    inf and NaN (NaN passes every bound)."""
    extra: JsonDict = {"flags": list(flags), "negative": None, "argument": False, "folder": False}
    return Field(PydanticUndefined, description=help or None, json_schema_extra=extra, **bounds)


def _split(kind: type):
    def split(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        items = value if isinstance(value, (list, tuple)) else [value]
        flag = "--" + str(info.field_name).replace("_", "-")
        return comma_list(",".join(str(v) for v in items), kind, flag)

    return split


def comma_separated(kind: type) -> Any:
    """A list of `kind` spelled as one comma-separated text on the command line and in YAML
    ('0.9,0.8'; a YAML list works too): parsed, distinct and non-empty, by unit.comma_list."""
    return Annotated[list[kind], BeforeValidator(_split(kind)), CommaSeparated()]  # type: ignore[valid-type]


# --- number types: the range of every number option of this kind, stated once ----------
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
LearningRate = Annotated[float, Field(ge=0.0, le=MAX_LR, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Schedule = comma_separated(float)  # budgets of one kind, one per round or sweep point
Names = comma_separated(str)
Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]  # a fraction, both ends included

# --- options whose help and range are shared, with defaults the stages choose -----------
BatchSize = Annotated[int, declared("Examples per forward pass.", ge=1)]
Samples = Annotated[int | None, declared("Use the first N examples of the data (default: all).", ge=1)]


class SeedOptions(Options):
    seed: Seed = option(
        0,
        f"Seed of everything random in the stage (data order, dropout, probes, a random draw); 0..{MAX_SEED}.",
    )


class TokenOptions(Options):
    max_length: int = option(
        128, "Truncate sequences to this many tokens (also the sequence length FLOPs are priced at).", ge=1
    )


class TimingOptions(Options):
    """How latency is timed: a profile and a report measure alike when these agree."""

    threads: int = option(2, "CPU threads while timing (torch.set_num_threads; as in `profile` and `report`).", ge=1)
    warmup: int = option(2, "Untimed warm-up calls before the timed ones (per model, or per profiled point).", ge=0)


class DeviceOptions(Options):
    device: str = option("auto", "Where to compute (and measure): " + DEVICE_HELP)
    dtype: str = option("auto", DTYPE_HELP)


class BudgetOptions(Options):
    """One amount to spend: a share of the heads or a share of the cost to keep. The values are
    range-checked by budget.checked when read, the one check every budget passes."""

    ratio: float | None = option(None, "Fraction of the kept heads to remove, in [0, 1].")
    target_params: float | None = option(None, "Keep this fraction of the parameters.")
    target_flops: float | None = option(None, "Keep this fraction of the FLOPs per token.")
    target_block_params: float | None = option(
        None,
        "Keep this fraction of the parameters inside the transformer blocks (the papers' non-embedding "
        "parameters: embeddings, tied LM head, final norm and task heads are not counted).",
    )

    def _amounts(self) -> dict[str, float | None]:
        return {
            "ratio": self.ratio,
            "target_params": self.target_params,
            "target_flops": self.target_flops,
            "target_block_params": self.target_block_params,
        }

    def budgets(self) -> list[Budget]:
        """The budgets given, each range-checked."""
        return [checked(b) for b in given(**self._amounts())]

    def budget(self) -> Budget | None:
        """The one budget given (None if none); two is a UsageError."""
        return one_of(**self._amounts())


class ShapeOptions(Options):
    """The shapes every plan keeps, whoever chooses it (select, prune, search, learned gates)."""

    min_heads: int = option(1, "Heads every layer keeps at least (drop a whole layer with --drop-layers).", ge=1)
    multiple_of: int = option(1, "Heads kept per layer must be a multiple of this.", ge=1)
    protect: str | None = option(None, "Heads never removed: LAYER:HEAD,... (original indices).")
    uniform: bool = option(
        False,
        "Keep the same number of heads (and KV groups, and FFN width) in every layer, chosen by score: "
        "LLaMA/Mistral/Qwen models then export as plain transformers folders.",
    )
    min_ffn: int | None = option(
        None,
        "FFN neurons every layer keeps at least, when the scores hold neuron scores (default: --ffn-multiple-of).",
        ge=1,
    )
    ffn_multiple_of: int = option(
        8, "FFN widths kept are multiples of this (8: what GPU matrix kernels tile by; 1 on CPUs costs nothing).", ge=1
    )

    def constraints(self) -> Constraints:
        """The Constraints value every chooser takes (stages/constraints.py)."""
        runtime, gguf_type = getattr(self, "runtime", None), getattr(self, "gguf_type", None)
        rules = shape_rules(check_runtime(runtime))
        if gguf_type is not None and runtime != "llama.cpp":
            raise UsageError("--gguf-type goes with --runtime llama.cpp (the GGUF file's quantization grid)")
        return Constraints(
            min_heads=self.min_heads,
            multiple_of=self.multiple_of,
            protect=parse_protect(self.protect),
            drop_layers=getattr(self, "drop_layers", 0),
            layer_threshold=getattr(self, "layer_threshold", None),
            gqa_unit=getattr(self, "gqa_unit", "group"),
            uniform=self.uniform or rules["uniform"],
            min_ffn=self.min_ffn,
            ffn_multiple_of=grid_ffn_multiple(self.ffn_multiple_of, gguf_type),
            uniform_heads=rules["uniform_heads"],
            runtime=runtime,
            gguf_type=gguf_type,
        )

    def shape_given(self) -> list[str]:
        """The shape options set to other than their defaults."""
        fields = ShapeOptions.model_fields
        return [name for name in fields if getattr(self, name) != fields[name].default]


class ConstraintOptions(ShapeOptions):
    """What every candidate plan chosen from scores must respect (select, prune, search)."""

    gqa_unit: str = option("group", "GQA layers: remove whole KV 'group's, or query 'head's evenly from every group.")
    runtime: str | None = option(
        None,
        "Choose only plans this engine loads: transformers (one shape for all layers, as --uniform), vllm (one "
        "head count, FFN widths per layer), llama.cpp or onnxruntime (any per-layer shapes).",
    )
    gguf_type: str | None = option(
        None,
        "With --runtime llama.cpp: the GGUF type the cut will ship in (q8_0, q4_0, q4_K_M, ...); FFN widths are kept "
        "on its quantization blocks (32 values, 256 for k-quants), so no matrix of the file falls back to a wider "
        "type and runs slower than the unpruned model's.",
    )


@dataclass(frozen=True)
class LoraSpec:
    """What the LoRA options say, as training/lora.py attaches it (and a resumed run must match)."""

    rank: int = 8
    alpha: float | None = None  # None: 2 x rank (the scale alpha / rank is then 2)
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None  # None: every block's attention and FFN projections

    @property
    def scale_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    def fingerprint(self) -> dict:
        """What a resumed run must share with the saved one."""
        return {"rank": self.rank, "alpha": self.scale_alpha, "dropout": self.dropout, "targets": self.targets}


class LoraOptions(Options):
    """Low-rank adapters (peft) instead of every weight: what recovery trains."""

    lora: bool = option(
        False,
        "Train low-rank adapters (peft) on the attention and FFN projections instead of every weight; "
        "they are merged into the output.",
    )
    lora_rank: int = option(8, "--lora: adapter rank r (at most the narrowest targeted projection's width).", ge=1)
    lora_alpha: Finite | None = option(None, "--lora: scaling alpha (the update is scaled by alpha / r; default 2 r).")
    lora_dropout: Finite = option(0.0, "--lora: dropout on the adapters' input, in [0, 1).")
    lora_targets: str | None = option(
        None,
        "--lora: projections to adapt, NAME[,NAME] matched as a module-name suffix (default: every block's "
        "attention and FFN projections, e.g. q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj).",
    )
    keep_adapter: Path | None = option(
        None,
        "--lora: also write the unmerged adapter here, in peft's format (a folder; applies to CHECKPOINT).",
        folder=True,
    )

    def lora_spec(self) -> LoraSpec:
        targets = (
            None if self.lora_targets is None else tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        )
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout, targets)

    def check_lora(self) -> None:
        """LoRA settings without --lora are refused (they would be silently ignored)."""
        if self.keep_adapter is not None and not self.lora:
            raise UsageError("--keep-adapter writes the LoRA adapter; it needs --lora")
        fields = LoraOptions.model_fields
        settings = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
        given_ = [f for f in settings if getattr(self, f) != fields[f].default]
        if given_ and not self.lora:
            raise UsageError(f"{', '.join('--' + f.replace('_', '-') for f in given_)}: LoRA settings need --lora")


class RecomputeOptions(Options):
    recompute: bool | None = option(
        None,
        "Recompute each block's activations in the backward instead of keeping them (gradient scores and "
        "training: less memory, one more forward per batch, the same results). Default: on from 400 M parameters; "
        "score and training also turn it on for a causal LM whose batch would outgrow its activation budget.",
        negative="--no-recompute",
    )


class TrainFilesOptions(Options):
    """What a training stage reads and writes: `finetune` and `learn`."""

    checkpoint: Path = option(..., "The checkpoint to train.", argument=True)
    data: Path = option(..., "Training data (JSONL/CSV/text/safetensors).")
    output: Path = option(..., "Where to write the trained checkpoint.", "-o", "--output")
    eval_data: Path | None = option(None, "Dev set: evaluated every epoch; the best epoch is kept.")
    teacher: str | None = option(None, "Distil from this checkpoint, or `auto` = the root model in CKPT's provenance.")
    force: bool = option(False, "Overwrite OUT if it exists.")


class TrainingOptions(SeedOptions, RecomputeOptions, DeviceOptions):
    """How the training loop (stages/training/train.py) trains, in `finetune` and `learn`:
    steps, rates, distillation, precision. RecoveryOptions adds recovery's resumable state."""

    epochs: int | None = option(None, "Passes over the training data (default 1 unless --steps).")
    steps: int | None = option(None, "Optimizer steps (instead of --epochs).")
    lr: LearningRate | None = option(
        None,
        f"Peak learning rate, in [0, {MAX_LR:g}] (default: about a tenth of the usual fine-tuning rate for the "
        "model's size; with --lora, 10x that).",
    )
    batch_size: int = option(16, "Rows per micro-batch, over all processes.", ge=1)
    grad_accum: int = option(1, "Micro-batches per optimizer step.", ge=1)
    warmup: Finite = option(0.1, "Warmup: a fraction of the steps (<1) or a step count.", ge=0)
    kd_weight: Finite | None = option(None, "Weight a of the distillation term (default 0.5 with a teacher).")
    kd_temperature: Finite = option(2.0, "Softmax temperature T for distillation.", ge=0.01)
    hidden_weight: Finite | None = option(
        None,
        "Weight of layer distillation: each block's output against the teacher's (relative squared error); "
        "default 1 in `learn` with a teacher, else 0.",
        ge=0.0,
    )
    autocast: bool | None = option(
        None,
        "Run the forward passes under bf16 autocast (weights, gradients and AdamW state keep their dtype). "
        "Default: on where the device computes bf16 natively (CUDA), off on CPU.",
        negative="--no-autocast",
    )
    # What the library fixes for recovery, settable from Python only.
    weight_decay: float = internal(0.0)  # recovery stays near the trained weights
    max_grad_norm: float = internal(1.0)
    stop_after: int | None = internal(None)  # stop as if interrupted after this many steps (tests)


class RecoveryOptions(TrainingOptions):
    """What the training loop reads (train.py): TrainingOptions, and recovery's resumable state
    and FSDP. `finetune` is these plus its files; a library caller builds them directly, as
    iterate, the refit layer scores and `learn` (from its own TrainingOptions) do."""

    fsdp: bool = option(
        False,
        "Under torchrun: shard weights, gradients, AdamW state and a teacher that is not a causal LM "
        "(one is streamed a block at a time) over the processes "
        "(FSDP2, one unit per block) instead of a full copy in each; the state is saved sharded and resumes "
        "with the same process count.",
    )
    state_dir: Path | None = option(
        None,
        "Training-state folder (default OUT.state); removed after success; a new, empty or headprune-made folder.",
        folder=True,
    )
    save_every: int = option(50, "Save the training state every N steps.", ge=1)
    resume: bool = option(False, "Continue from the saved training state.")
