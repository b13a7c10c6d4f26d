#!/usr/bin/env bash
# Prune the bundled example end to end and print the report.  Usage: bash scripts/demo.sh
# score -> select -> prune -> finetune -> report, as configs/demo.yaml says; artifacts in out/demo.
source "$(dirname "$0")/_env.sh"
OUT="${OUT:-out/demo}"
headprune run configs/demo.yaml --out "$OUT" --force
echo
cat "$OUT/report.md"
