"""import_."""
