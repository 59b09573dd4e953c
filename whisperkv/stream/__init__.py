"""Live transcription: audio arrives in pieces, committed text leaves with bounded latency.

Read in this order: ``events`` (what a stream emits), ``agreement`` (LocalAgreement-2: when a word is
final), ``vad`` (silero-vad: skip silence, close an utterance), ``reuse`` (what an update may carry from
the previous one, decided by provenance), ``prompt_decode`` (greedy decoding whose prompt Self-KV can be
reused), ``local_decoder`` (one update: buffer → hypothesis, in this process), ``session`` (the policy
that ties them; ``pauses`` and ``long_words`` are parts of it, each a kind of second hearing), ``clock``
and ``runner`` (feeding a session at real or simulated time), ``pcm`` and ``command`` (``whisperkv
stream``). The WebSocket front end is ``whisperkv.serve.realtime``.
"""
