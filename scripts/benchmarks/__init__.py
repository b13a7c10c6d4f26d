"""headprune's benchmarks; results in BENCHMARKS.md. Run from the repository root:

    python -m scripts.benchmarks.suite [--quick --out /tmp/b.md]   # every section of one run (1-7, 11)

One module per BENCHMARKS.md section: score (1. scoring cost), speed (2. measured vs
predicted speedup), quality (3. fidelity per method), recovery (4.), suite itself
(5. pipeline wall time), peer (6. Torch-Pruning, 7. onnxruntime latency), large (8. large
models), startup (9. start-up time), depth (10. quality at depth), decode (11. serving a
causal LM). compensation and hostile measure what their docstrings say, outside that
document's run. common: the models and text every benchmark shares; debian_task: the
Debian-sections classifiers and the stage runs the benchmarks on them share; render:
BENCHMARKS.md from one suite run.
"""
