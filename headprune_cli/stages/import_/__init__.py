"""`import`: a model folder -> one headprune checkpoint (a keyword, hence the underscore)."""
