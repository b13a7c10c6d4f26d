"""`score`: importance of heads, FFN neurons and layers. stage.py (options, run), table.py
(the in-memory ScoreTable), importance/ (the scorers and their registry)."""
