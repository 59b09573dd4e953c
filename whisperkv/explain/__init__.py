"""``whisperkv explain``: one file's journey through the model, drawn from its real data.

``trace`` replays a window that transcription decoded and records every stage; ``figures`` draws it;
``page`` writes the HTML; ``command`` is the CLI.
"""
