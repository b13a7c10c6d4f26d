"""The pipeline's stages as library functions: score (importance/), select, compensate,
finetune, iterate, report, sweep."""
