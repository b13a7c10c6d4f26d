"""`report`: building the report (build), its artifact schema, rendering, and measured latency."""
