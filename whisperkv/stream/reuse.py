"""Reuse bookkeeping: what an update asked to carry forward, what was accepted, what was refused and why.

An update may reuse the previous update's encoder output, its Cross-KV and the Self-KV of its prompt
only when the provenance records are equal; ``first_difference`` names the field that is not (for a
grown buffer: ``mel_digest``, since the log-Mel is normalised by the buffer's maximum and the window's
content changed). Decisions go through the stream's ``CacheStore`` so its report lists them too; the
ledger adds counts per kind and per refusing field for the ``reuse`` summary.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from whisperkv.cache.store import CacheStore, check_reuse
from whisperkv.errors import CacheReuseError

KINDS = ("encoder_output", "cross_kv", "prompt_self_kv")


@dataclass
class ReuseLedger:
    store: CacheStore
    attempted: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    refused: defaultdict = field(default_factory=lambda: defaultdict(Counter))
    forced: Counter = field(
        default_factory=Counter
    )  # invalid reuse taken on purpose (the benchmark's naive path)

    def ask(self, kind: str, cached: object, requested: object) -> bool:
        """Accept ``cached`` for a computation that needs ``requested`` only on an exact provenance match."""
        self.attempted[kind] += 1
        try:
            check_reuse(kind, cached, requested)
        except CacheReuseError as err:
            self.refused[kind][err.field] += 1
            self.store.refusals.append(str(err))
            return False
        self.accepted[kind] += 1
        self.store.hits.append(f"{kind} reused: provenance identical")
        return True

    def force(self, kind: str) -> None:
        self.forced[kind] += 1

    def summary(self) -> dict:
        out = {
            "type": "reuse",
            "attempted": {k: self.attempted[k] for k in KINDS},
            "accepted": {k: self.accepted[k] for k in KINDS},
            "refused": {k: dict(self.refused[k]) for k in KINDS},
        }
        if self.forced:
            out["forced_invalid"] = {k: self.forced[k] for k in KINDS}
        return out
