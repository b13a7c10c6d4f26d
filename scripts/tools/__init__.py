"""Fixture makers and QA tools, each run by path (`python scripts/tools/NAME.py`):
make_causal_lm, make_debian_task and train_demo build models and tasks; check_mutations,
mutation.sh and gpu_check check the tests and the accelerator paths. A package as well, so
a benchmark can import a maker's constants (`from scripts.tools.make_debian_task import ...`).
"""
