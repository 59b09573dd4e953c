"""Many files as one resumable, checkable job (``whisperkv batch``): inputs → ledger → engine → records.

``inputs`` expands files, folders and manifests; ``ledger`` is ``results.jsonl`` (what is done, with what);
``work`` transcribes one file; ``local`` and ``ray_engine`` run that work on processes or Ray actors;
``job`` ties them together; ``command`` is the CLI.
"""
