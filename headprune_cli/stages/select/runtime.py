"""`--runtime`: the serving engine a plan must load in, as constraints on the selection.

What each engine loads of a LLaMA-family cut (what its export writes; docs/serving.md):
- transformers: one config for all layers, so one query-head count, one KV-head count and one
  FFN width (`uniform`, the rule of a plain config).
- vllm: nemotron-nas blocks (model/formats/vllm.py): one query-head count for every layer, KV
  heads and FFN widths per layer (`uniform_heads`). Every layer's KV groups keep one size, so
  with one query-head count per layer the KV-head count is one too: heads are uniform, FFN
  widths are chosen per layer (choose_same_heads below).
- llama.cpp: GGUF `deci`, per-layer query heads, KV heads and FFN widths: any plan.
- onnxruntime: the ONNX graph states every layer's shapes: any plan.

The names and the Constraints fields each sets (`check_runtime`, `shape_rules`) live in
stages/constraints.py, where the shared option groups build the constraints; here is what
needs the scores: whether the engine serves the scored model, and the vLLM chooser.
"""

from __future__ import annotations

from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import SLACK
from headprune_cli.stages.select import uniform as uniform_levels
from headprune_cli.stages.select.plan import candidates, model_ref


def check_serves(runtime: str | None, scores, source: str | None) -> None:
    """Refuse an engine that cannot serve the scored model at all (vLLM's nemotron-nas and
    llama.cpp's GGUF take LLaMA-family causal LMs only), before any plan is chosen. The family
    is read from the header of the checkpoint the scores name; when that is not at hand,
    classifier scores still say enough (export refuses the rest with the same words)."""
    if runtime not in ("vllm", "llama.cpp"):
        return
    served = _served_model_types(runtime)
    found = [p for p in candidates(model_ref(scores).path, source) if p.is_file()]
    if found:
        from headprune_cli.model.checkpoint import read_info  # noqa: PLC0415 (torch only when the header is read)

        info = read_info(found[0])
        model_type = info.config.get("model_type")
        if info.family == "llama" and model_type in served and info.task == "causal-lm":
            return
        what = f"the scored model {found[0]} is a {model_type or info.family} {info.task}"
    elif scores.objective == "classification":
        what = "these scores are of a classifier"
    else:
        return
    raise UsageError(
        f"--runtime {runtime} serves LLaMA-family causal LMs ({', '.join(served)}); {what}: "
        "choose --runtime onnxruntime or transformers"
    )


def _served_model_types(runtime: str) -> tuple[str, ...]:
    from headprune_cli.model.formats import gguf, vllm  # noqa: PLC0415 (the exports' own lists, loaded when asked)

    return vllm.FAMILIES if runtime == "vllm" else gguf.FAMILIES


def choose_same_heads(table, layers: dict, outside: float, limit: float):
    """One head level for every layer and FFN widths per layer: for each head level the common
    chains allow, neuron steps are taken greedily (least loss per unit saved) until the predicted
    cost (`outside`: of everything not in `layers`) fits; the level whose fitting state lost the
    least wins (None when none fits)."""
    best = None
    for level in uniform_levels.levels(table, [lay.heads for lay in layers.values()]):
        state = {l: [lay.heads.allowed.index(level[l]), 0] for l, lay in layers.items()}
        if not _fill_ffn(layers, state, lambda s: outside + sum(layers[l].price(*s[l]) for l in s) <= limit * SLACK):
            continue
        loss = sum(layers[l].paid(*state[l]) for l in state)
        if best is None or loss < best[0]:
            best = (loss, state)
    return None if best is None else best[1]


def _fill_ffn(layers: dict, state: dict, fits) -> bool:
    """Neuron steps, least loss per unit saved first, until `fits(state)`; False when none is left."""
    while not fits(state):
        steps = []
        for layer, (h, f) in state.items():
            lay = layers[layer]
            if lay.neurons is None or f + 1 >= len(lay.neurons.allowed):
                continue
            saving = lay.price(h, f) - lay.price(h, f + 1)
            if saving > 0:
                steps.append(((lay.neuron_paid[f + 1] - lay.neuron_paid[f]) / saving, layer))
        if not steps:
            return False
        state[min(steps)[1]][1] += 1
    return True
