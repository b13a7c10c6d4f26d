"""What the tests share, imported as `from tests.support import ...`; fixtures stay in tests/conftest.py.

models: the tiny random models of every family and what is done to them; refusals: the
answer a command must give to bad input; reports: a fast `headprune report`; data: tiny
tokenizers and data files; scores:
scores artifacts written by hand; selection: score tables built directly; deploy: a
consumer process that cannot import headprune; hostile_files: inputs that claim memory or
time; forkserver: many `headprune` commands for the price of one import;
compensation_reference: the earlier compensation algorithm, kept to compare against.
"""

from pathlib import Path

from .compensation_reference import compensate_old, count_computed
from .data import give_tokenizer, sentences, word_tokenizer, write_jsonl, write_text
from .deploy import run_without_headprune
from .forkserver import ForkServer
from .hostile_files import BOMBS
from .models import (
    CAUSAL,
    PLANS,
    TINY,
    VOCAB,
    calibration,
    counted_macs,
    ffn_plan,
    gqa_plan,
    model_inputs,
    model_output,
    plan_for,
    pruned,
    width_of,
)
from .processes import PANIC_TEXT, assert_one_error, env, finished, headprune, leftovers
from .refusals import CliResult, assert_refused, snapshot
from .reports import FAST_REPORT, run_report
from .scores import saved_model, scores_for, tensor_data, write_scores
from .selection import check_constraints, mha, requests, synthetic_cost, tables, with_budget
from .training import saved_root, tensor_set

ROOT = Path(__file__).resolve().parents[2]  # the repository: examples/, configs/, scripts/, README.md

__all__ = [
    "count_computed",
    "ROOT",
    "BOMBS",
    "saved_root",
    "tensor_set",
    "PANIC_TEXT",
    "assert_one_error",
    "env",
    "finished",
    "headprune",
    "leftovers",
    "ffn_plan",
    "gqa_plan",
    "plan_for",
    "width_of",
    "CAUSAL",
    "FAST_REPORT",
    "PLANS",
    "TINY",
    "VOCAB",
    "CliResult",
    "ForkServer",
    "assert_refused",
    "calibration",
    "check_constraints",
    "compensate_old",
    "counted_macs",
    "give_tokenizer",
    "mha",
    "model_inputs",
    "model_output",
    "pruned",
    "requests",
    "run_report",
    "run_without_headprune",
    "saved_model",
    "scores_for",
    "sentences",
    "snapshot",
    "synthetic_cost",
    "tables",
    "with_budget",
    "tensor_data",
    "word_tokenizer",
    "write_jsonl",
    "write_scores",
    "write_text",
]
