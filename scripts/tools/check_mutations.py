"""Apply each hand-made mutation of a policy path (gates, budgets, refusals) to a scratch
copy of the tree and run the test that must catch it; prints one line per mutation
(CAUGHT when the test fails).

Not part of CI (minutes per mutation). docs/testing.md records a run.

    python scripts/tools/check_mutations.py                 # all
    python scripts/tools/check_mutations.py max-drop sgd    # some, by name
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name: (file, original text, mutated text, the test that must fail)
MUTATIONS = {
    "max-drop <= to <": (
        "headprune_cli/stages/report/build.py",
        "main.drop <= max_drop))",
        "main.drop < max_drop))",
        "tests/stages/report/test_policy.py::test_max_drop_passes_at_the_threshold_and_fails_one_ulp_below",
    ),
    "max-rel-drop <= to <": (
        "headprune_cli/stages/report/build.py",
        "main.rel_drop <= max_rel_drop))",
        "main.rel_drop < max_rel_drop))",
        "tests/stages/report/test_policy.py::test_max_rel_drop_passes_at_the_threshold_and_fails_one_ulp_below",
    ),
    "min-speedup >= to >": (
        "headprune_cli/stages/report/build.py",
        "speedup >= min_speedup))",
        "speedup > min_speedup))",
        "tests/stages/report/test_policy.py::test_min_speedup_passes_at_the_threshold_and_fails_one_ulp_above",
    ),
    "finetune returns the last epoch": (
        "headprune_cli/stages/training/train.py",
        "        if self.best is not None:\n            self.model.load_state_dict(self.best)",
        "        pass",
        "tests/stages/training/test_training.py::test_the_returned_weights_are_the_best_epochs",
    ),
    "torchrun gradients halved": (
        "headprune_cli/stages/training/train.py",
        "(loss_sum * self.ctx.world / grand).backward()",
        "(loss_sum / grand).backward()",
        "tests/stages/finetune/test_command.py::test_torchrun_sgd_updates_match_one_process_far_below_the_update_size",
    ),
    "target-flops budgets params": (
        "headprune_cli/stages/select/strategies.py",
        'key = "params" if target_params is not None else "flops_per_token"\n    fraction',
        'key = "params"\n    fraction',
        "tests/stages/select/test_budget.py::test_target_flops_budgets_flops_and_target_params_budgets_params",
    ),
    "baseline auto skips sha256": (
        "headprune_cli/stages/report/build.py",
        "    if sha256_file(path) != root:",
        "    if False:",
        "tests/stages/report/test_policy.py::test_baseline_auto_refuses_a_root_whose_bytes_changed",
    ),
    "sweep skips compensation": (
        "headprune_cli/stages/sweep/loop.py",
        'if opts.compensate != "none":',
        "if False:",
        "tests/stages/sweep/test_sweep.py::test_sweep_compensation_changes_the_result_to_what_compensating_by_hand_gives",
    ),
    "protect validation removed": (
        "headprune_cli/stages/select/strategies.py",
        "    for layer, head in c.protect:\n        if head not in table.heads.get(layer, {}):",
        "    for layer, head in ():\n        if head not in table.heads.get(layer, {}):",
        "tests/stages/select/test_select.py::test_select_bad_input_is_one_error_line_and_writes_nothing",
    ),
    "a crash passes for a refusal": (
        "headprune_cli/cli/app.py",
        "        return _internal(exc)",
        "        return _fail(str(exc), EXIT_ERROR)",
        "tests/cli/test_error_mapping.py::test_bug_is_an_internal_error_not_a_refusal",
    ),
    # The bugs of issue 48: each one small and plausible, each caught by a test against an independent reference.
    "lora alpha set to the rank": (
        "headprune_cli/stages/training/lora.py",
        "lora_alpha=spec.scale_alpha,",
        "lora_alpha=spec.rank,",
        "tests/stages/finetune/test_lora.py::test_merged_update_is_b_times_a_scaled_by_alpha_over_rank",
    ),
    "gguf llama3 rope_freqs branches swapped": (
        "headprune_cli/model/formats/gguf.py",
        "            factors.append(1.0)\n        elif wavelen > low_wavelen:\n            factors.append(factor)",
        "            factors.append(factor)\n        elif wavelen > low_wavelen:\n            factors.append(1.0)",
        "tests/model/formats/test_gguf.py::test_rope_of_each_type_gives_transformers_frequencies",
    ),
    "vllm config.json without rope": (
        "headprune_cli/model/formats/vllm.py",
        '        "rope_theta",\n        "rope_scaling",\n        "rope_parameters",\n',
        "",
        "tests/model/formats/test_vllm.py::test_config_json_gives_transformers_rope_of_each_type",
    ),
    "tasks shared plan from the first task only": (
        "headprune_cli/stages/tasks/plans.py",
        "choose(shared_table(tables), ",
        "choose(shared_table(tables[:1]), ",
        "tests/stages/tasks/test_tasks_stage.py::test_shared_plan_is_select_on_the_summed_normalised_scores",
    ),
    "tasks shared importance_kept on the own kept set": (
        "headprune_cli/stages/tasks/payload.py",
        '"importance_kept": retained(table, shared),',
        '"importance_kept": retained(table, own[n]),',
        "tests/stages/tasks/test_tasks_stage.py::test_shared_plan_is_select_on_the_summed_normalised_scores",
    ),
    "iterate lstsq pruned metric = refit metric": (
        "headprune_cli/stages/iterate/rounds.py",
        "    return refit, before, metric(refit)",
        "    return refit, metric(refit), metric(refit)",
        "tests/stages/iterate/test_lstsq_rounds.py::test_lstsq_rounds_report_the_plain_cuts_metric_then_the_refits",
    ),
    "iterate finetune pruned metric = last epoch": (
        "headprune_cli/stages/iterate/rounds.py",
        "pruned_value = trained.history[0].metrics[base.name]",
        "pruned_value = trained.history[-1].metrics[base.name]",
        "tests/stages/iterate/test_iterate.py::test_finetune_rounds_report_the_cut_before_training",
    ),
    "select runtime FFN step by max": (
        "headprune_cli/stages/select/runtime.py",
        "state[min(steps)[1]][1] += 1",
        "state[max(steps)[1]][1] += 1",
        "tests/stages/select/test_runtime.py::test_vllm_ffn_steps_go_to_the_least_loss_per_cost_saved",
    ),
    "gate space per_kind counts GQA units": (
        "headprune_cli/stages/learn/gate_space.py",
        "heads = torch.tensor([len(hs) for _, hs in self.head_units], dtype=torch.float64)\n        counts",
        "heads = torch.ones(len(self.head_units), dtype=torch.float64)\n        counts",
        "tests/stages/learn/test_gate_space.py::test_per_kind_counts_query_heads_neurons_and_layers",
    ),
    "int8-static runs quantize_dynamic": (
        "headprune_cli/model/formats/onnx_quantize.py",
        'if kind == "int8-dynamic":\n                q.quantize_dynamic(',
        'if kind in ("int8-dynamic", "int8-static"):\n                q.quantize_dynamic(',
        "tests/model/formats/test_onnx_quantize.py::test_static_is_qdq_with_calibrated_ranges_and_dynamic_quantizes_at_run_time",
    ),
    "gradient scale without world (one rank)": (
        "headprune_cli/stages/training/train.py",
        "(loss_sum * self.ctx.world / grand).backward()",
        "(loss_sum / grand).backward()",
        "tests/stages/training/test_training.py::test_a_rank_backpropagates_its_rows_loss_sum_times_world_over_the_global_count",
    ),
    "rewind reads the source's heads by position": (
        "headprune_cli/stages/finetune/rewind.py",
        "layer: [h for h in have.heads[have.position(layer)] if h not in target.heads[pos]]",
        "layer: [h for h in have.heads[pos] if h not in target.heads[pos]]",
        "tests/stages/finetune/test_rewind.py::test_rewind_onto_a_partly_pruned_source_reads_each_layer_by_its_original_index",
    ),
    "fsdp resume without each rank's RNG": (
        "headprune_cli/stages/training/sharding.py",
        '        torch.set_rng_state(load_file(str(target / f"rng-{ctx.rank}.safetensors"))["rng.torch"])',
        "        pass",
        "tests/stages/training/test_fsdp.py::test_fsdp_over_two_processes_equals_one_process_and_resumes_exactly",
    ),
    "imatrix counts padding": (
        "headprune_cli/model/formats/layer_inputs.py",
        "return rows[keep] if keep is not None and keep.numel() == rows.shape[0] else rows",
        "return rows",
        "tests/model/formats/test_gguf_imatrix.py::test_importance_counts_real_tokens_only",
    ),
    "imatrix nibbles swapped": (
        "headprune_cli/model/formats/gguf_imatrix.py",
        "(codes[..., :16] | (codes[..., 16:] << 4))",
        "((codes[..., :16] << 4) | codes[..., 16:])",
        "tests/model/formats/test_gguf_imatrix.py::test_every_block_fits_its_weights_at_least_as_well_as_the_reference_rounding",
    ),
    "imatrix levels of the first factor": (
        "headprune_cli/model/formats/gguf_imatrix.py",
        "_levels(x, safe, factor)",
        "_levels(x, safe, _FACTORS[0])",
        "tests/model/formats/test_gguf_imatrix.py::test_each_stored_scale_is_the_weighted_least_squares_scale_of_its_stored_levels",
    ),
    "imatrix hooks the blocks only": (
        "headprune_cli/model/formats/gguf_imatrix.py",
        "if isinstance(m, nn.Linear)}",
        'if isinstance(m, nn.Linear) and name != "lm_head"}',
        "tests/model/formats/test_gguf_imatrix.py::test_a_tied_embedding_is_weighed_as_the_output_head_it_also_is",
    ),
    "gptq error kept within its lazy batch": (
        "headprune_cli/model/formats/gguf_gptq.py",
        "w[:, end:] -= errors @ inverse[start:end, end:]",
        "w[:, end:] -= 0",
        "tests/model/formats/test_gguf_gptq.py::test_the_layer_output_on_the_text_is_closer_than_nearest_rounding_at_weighted_scales",
    ),
    "gptq bytes in the checkpoint's Q/K row order": (
        "headprune_cli/model/formats/gguf.py",
        "yield _permuted(torch.from_numpy(self.t.quantized), self.t.name, self.plan).numpy()",
        "yield self.t.quantized",
        "tests/model/formats/test_gguf_gptq.py::test_export_rounds_every_q4_0_matrix_closer_on_the_text",
    ),
    "gptq scale not rounded to the stored f16": (
        "headprune_cli/model/formats/gguf_gptq.py",
        ".to(torch.float16).float()",
        "",
        "tests/model/formats/test_gguf_gptq.py::test_with_uncorrelated_inputs_each_weight_is_its_nearest_level_at_the_stored_scale",
    ),
    "refit target without the residual drift": (
        "headprune_cli/stages/prune/compensation.py",
        "rewritten=rewritten, residual=residual",
        "rewritten=rewritten, residual=None",
        "tests/stages/prune/test_compensation_ffn.py::test_the_refit_solves_the_least_squares_problem_it_states",
    ),
    "refit tokens weighted by the projection's output, not the target": (
        "headprune_cli/stages/refit/streams.py",
        "norms = (target * target).sum(1)",
        "norms = ((x_full @ w_full.to(x_full.device).T) ** 2).sum(1)",
        "tests/stages/prune/test_compensation.py::test_streaming_equals_the_old_algorithm",
    ),
    "llama FFN residual read at the block's input": (
        "headprune_cli/model/arch/llama.py",
        "else layer.post_attention_layernorm",
        "else layer",
        "tests/model/test_adapters.py::test_residual_input_reads_the_stream_each_projection_is_added_to",
    ),
}


def check(name: str) -> str:
    path, old, new, test = MUTATIONS[name]
    with tempfile.TemporaryDirectory(prefix="hp-mutation-") as tmp:
        files = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        for f in files:
            if (ROOT / f).is_file():
                (Path(tmp) / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, Path(tmp) / f)
        target = Path(tmp) / path
        source = target.read_text()
        if source.count(old) < 1:
            return f"STALE   {name}: the original text is no longer in {path}"
        target.write_text(source.replace(old, new, 1))
        env = {
            **os.environ,
            "PYTHONPATH": tmp,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        start = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - start
        verdict = "CAUGHT " if run.returncode == 1 else "MISSED " if run.returncode == 0 else f"ERROR{run.returncode} "
        return f"{verdict} {name}: {test} ({took:.0f} s)"


def main() -> int:
    names = [n for n in MUTATIONS if not sys.argv[1:] or any(a in n for a in sys.argv[1:])]
    results = []
    for n in names:
        results.append(check(n))
        print(results[-1], flush=True)
    return 0 if all(r.startswith("CAUGHT") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
