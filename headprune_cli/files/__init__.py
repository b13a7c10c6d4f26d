"""File safety: atomic writes and hashes (io), what a command may write or replace (outputs),
temporaries and their cleanup (temps), and the watching parent that reports a killed child (watcher)."""
