"""`export --vllm DIR`: the export stage's vLLM branch (the config is model/formats/vllm.py).

The folder is checked and the plan judged (one query-head count, whole groups) on the meta model
before a byte is written; the weights then stream from the checkpoint tensor by tensor, as for
`export --hf`.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.stages.unit import Context, Result


def export_vllm_folder(checkpoint: Path, out: Path, force: bool, max_shard_size: str, ctx: Context) -> Result:
    from headprune_cli.model.formats.hf import check_folder_output, export_hf, weights_written  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.formats.vllm import CONFIG_FILE, CONFIG_MODULE, nas_folder_config, nas_plan  # noqa: PLC0415 (keeps transformers out of this module's import)
    from headprune_cli.model.layout import info_of  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.streaming import export_specs  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.tensorfile import parse_size  # noqa: PLC0415 (keeps numpy, torch out of this module's import)

    check_folder_output(out, force, inputs=[checkpoint], what="--vllm folder")
    parse_size(max_shard_size)
    model, specs = export_specs(checkpoint)  # on the meta device: shapes and layout, no weight read yet
    info = info_of(model)
    plan = nas_plan(info)  # refuses before a byte is written
    layout = nas_folder_config(info, plan)
    export_hf(
        model,
        out,
        force=force,
        inputs=[checkpoint],
        max_shard_size=max_shard_size,
        specs=specs,
        with_onnx=False,
        layout=layout,
        extra_files={f"{CONFIG_MODULE}.py": CONFIG_FILE},
    )
    kv = "/".join(str(n) for n in plan.kv_heads)
    ffn = "/".join(str(n) for n in plan.ffn)
    ctx.print(
        f"wrote {out}/ (vLLM nemotron-nas: {len(plan.ffn)} layers, {plan.heads} query heads, KV heads {kv}, "
        f"FFN widths {ffn}; config.json, {weights_written(out, layout.weights)}, {CONFIG_MODULE}.py, headprune.json)",
        soft_wrap=True,
        markup=False,
    )
    ctx.print(
        f"serve it: vllm serve {out} --trust-remote-code (the folder's own {CONFIG_MODULE}.py parses the blocks)",
        soft_wrap=True,
        markup=False,
    )
    return Result([str(out)], value=plan)
