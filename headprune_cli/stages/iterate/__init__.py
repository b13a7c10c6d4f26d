"""iterate."""
