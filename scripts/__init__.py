"""Repository scripts: set-up entry points (test.sh, demo.sh) here, benchmarks/ and tools/ below.

A package so that the benchmarks run as modules from the repository root,
`python -m scripts.benchmarks.NAME`, importing each other without touching sys.path.
"""
