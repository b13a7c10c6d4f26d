"""`export`: deployment files (the writers live in model/)."""
