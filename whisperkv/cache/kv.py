"""The decoder's two caches, as distinct types with shapes, byte counts and provenance.

* ``SelfKV``  — per decoder layer, the keys/values of the tokens decoded so far. It grows by one
  position per generated token and is written in place into a preallocated buffer.
* ``CrossKV`` — per decoder layer, the keys/values of the encoder output. Projected once per audio
  window and only read afterwards, by every step and every beam of that window.
* ``DecoderCache`` — both, for every layer, plus the token ids the Self-KV positions hold.

Memory: a cache of B rows, L layers, T positions, width d and s bytes per element holds
2·B·L·T·d·s bytes (the 2 is keys + values). ``nbytes`` reports exactly that from the live tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from whisperkv.cache.provenance import CrossKVProvenance, SelfKVProvenance
from whisperkv.errors import CacheReuseError


@dataclass(frozen=True)
class LayerShape:
    layer: int
    shape: tuple[int, int, int]  # (batch, positions, width) of keys; values have the same shape
    nbytes: int


class CrossKV:
    """Keys and values of one decoder layer's cross-attention over one encoder output.

    Built from the decoder's projection of one encoder output (``TextDecoder.project_cross_kv``);
    there is no method that writes into it afterwards. Beams of the same
    audio share one CrossKV: attention groups their queries instead of copying the keys.
    """

    def __init__(self, key: torch.Tensor, value: torch.Tensor, provenance: CrossKVProvenance) -> None:
        self.key = key
        self.value = value
        self.provenance = provenance

    def rows(self, index: torch.Tensor) -> CrossKV:
        """The same projections for only the audio rows in ``index`` (a batch minus its finished rows)."""
        return CrossKV(self.key.index_select(0, index), self.value.index_select(0, index), self.provenance)

    @property
    def layer(self) -> int:
        return self.provenance.layer

    @property
    def shape(self) -> tuple[int, int, int]:
        """(batch, positions, width): keys are stored split into heads, [B, H, T, d/H]."""
        b, h, t, dh = self.key.shape
        return (b, t, h * dh)

    @property
    def nbytes(self) -> int:
        return self.key.numel() * self.key.element_size() + self.value.numel() * self.value.element_size()


def reorder_moves(rows: torch.Tensor) -> list[tuple[int, int]]:
    """(row, parent) for every row of a reorder whose parent is another row: what ``SelfKV.reorder``
    copies when the row count stays."""
    return [(row, parent) for row, parent in enumerate(rows.tolist()) if row != parent]


class SelfKV:
    """Keys and values of one decoder layer's masked self-attention, one position per token.

    The buffer is allocated once for the whole text context; ``append`` writes the newest
    positions in place, so a decoding step never concatenates or reallocates.
    """

    def __init__(
        self,
        layer: int,
        batch: int,
        capacity: int,
        width: int,
        dtype: torch.dtype,
        device: torch.device | str,
        n_head: int = 1,
    ) -> None:
        self.layer = layer
        # [B, H, capacity, d/H]: a read of the first T positions is a view with contiguous rows.
        # Not zeroed: only positions below ``length`` are ever read (every read is a view up to it), and
        # zeroing wrote every page of the 448-position buffer, so the whole capacity was resident from the
        # first step (base, beam 5: 55 MB) where a window uses a few hundred positions at most
        shape = (batch, n_head, capacity, width // n_head)
        self._key = torch.empty(shape, dtype=dtype, device=device)
        self._value = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        self._owner: weakref.ref[DecoderCache] | None = None

    @property
    def owner(self) -> DecoderCache | None:
        """The DecoderCache this layer belongs to. Held weakly: a strong reference both ways would
        be a cycle, and every window's caches (~23 MB for tiny.en) would then outlive it until the
        garbage collector's next full pass (measured: RSS grew by that much per window)."""
        return self._owner() if self._owner is not None else None

    @owner.setter
    def owner(self, cache: DecoderCache | None) -> None:
        self._owner = weakref.ref(cache) if cache is not None else None

    def provenance(self, row: int = 0) -> SelfKVProvenance:
        """The prefix this layer holds for ``row``, its positions, and the Cross-KV it attended to."""
        if self.owner is None:
            raise ValueError("a Self-KV outside a DecoderCache has no recorded prefix")
        return self.owner.self_provenance(row, self.layer)

    @property
    def capacity(self) -> int:
        return self._key.shape[2]

    def append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write the keys/values [B, H, n, d/H] of n new positions after the ones held."""
        n = key.shape[2]
        self._check_room(n)
        self._key[:, :, self.length : self.length + n] = key
        self._value[:, :, self.length : self.length + n] = value
        self.length += n

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers [B, H, capacity, d/H], for a kernel that writes the next
        position itself (``cpu/block_step.py``) and then calls ``grow``."""
        return self._key, self._value

    def grow(self, n: int) -> None:
        """Count ``n`` positions written after the ones held (by a kernel, into ``buffers``)."""
        self._check_room(n)
        self.length += n

    def _check_room(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise ValueError(
                f"Self-KV of layer {self.layer} is full: {self.length} + {n} > {self.capacity} positions"
            )

    def truncate(self, length: int) -> None:
        """Hold only the first ``length`` positions; the buffer keeps its place, and the next
        ``append`` overwrites what lay beyond."""
        if not 0 <= length <= self.length:
            raise ValueError(f"Self-KV of layer {self.layer} holds {self.length} positions, not {length}")
        if self.owner is not None:
            self.owner.note_peak()  # the bytes held fall: the owner's peak is taken first
        self.length = length

    @property
    def key(self) -> torch.Tensor:
        return self._key[:, :, : self.length]

    @property
    def value(self) -> torch.Tensor:
        return self._value[:, :, : self.length]

    def reorder(self, rows: torch.Tensor, moves: list[tuple[int, int]] | None = None) -> None:
        """Make row i hold what row ``rows[i]`` held: beams follow their surviving parents.

        Only the positions held are moved. With as many rows as before (a beam step) the rows whose
        parent changed are rewritten in place, from a copy of their parents' rows: most beams keep
        their own prefix, and a fresh 448-position buffer every step (as before) cost as much time,
        in page faults, as all the step's matrix products. Row by row (``moves``: (row, parent) for
        each changed row, ``reorder_moves``; a cache computes them once for its layers): indexing with
        the changed rows' tensor took 0.81 ms a beam-5 step for tiny.en's four layers, row by row 0.43
        (scratch, round 15: 3 of 5 rows moved, 100 positions). Another row count (the prompt copied to
        every beam, finished windows dropped) takes a fresh buffer.
        """
        n = self.length
        if rows.shape[0] == self._key.shape[0]:
            moves = reorder_moves(rows) if moves is None else moves
            for buffer in (self._key, self._value):
                parents = [buffer[parent, :, :n].clone() for _, parent in moves]  # all read before any write
                for (row, _), held in zip(moves, parents, strict=True):
                    buffer[row, :, :n].copy_(held)
            return
        for name in ("_key", "_value"):
            old = getattr(self, name)
            new = old.new_empty((rows.shape[0], *old.shape[1:]))
            new[:, :, :n] = old[:, :, :n].index_select(0, rows)
            setattr(self, name, new)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(batch, positions held, width), whatever the head layout inside."""
        b, h, _, dh = self._key.shape
        return (b, self.length, h * dh)

    @property
    def nbytes(self) -> int:
        b, t, d = self.shape
        return 2 * b * t * d * self._key.element_size()

    @property
    def allocated_nbytes(self) -> int:
        return 2 * self._key.numel() * self._key.element_size()


class DecoderCache:
    """Everything the decoder remembers for one batch of sequences: Self-KV and Cross-KV per layer.

    ``tokens`` holds the ids whose keys/values sit in the Self-KV, so the cache can say exactly which
    prefix it was built from (its provenance) and refuse to serve another one.
    """

    def __init__(
        self,
        self_kv: list[SelfKV],
        cross_kv: list[CrossKV],
        reorder_layers: Callable[[list[SelfKV], list[tuple[int, int]]], bool] | None = None,
    ) -> None:
        """``reorder_layers``: a backend's reorder of every layer at once (``StepPlan.reorder``), which
        may decline (False); without one, or where it declines, layer by layer."""
        if len(self_kv) != len(cross_kv):
            raise ValueError("one SelfKV and one CrossKV per decoder layer")
        owners = {kv.provenance.encoder.request_id for kv in cross_kv}
        if len(owners) > 1:
            raise CacheReuseError("Cross-KV", "encoder.request_id", *sorted(owners)[:2])
        #: the request every row of this cache belongs to: the one its Cross-KV was computed for
        self.request_id = owners.pop() if owners else ""
        self.self_kv = self_kv
        self.cross_kv = list(cross_kv)  # its own list: ``keep_rows`` replaces entries, never the caller's
        for kv in self_kv:
            kv.owner = self  # so a layer's Self-KV can state its own provenance
        batch = self_kv[0].shape[0] if self_kv else 0
        # the ids held, in a NumPy buffer written in place (a step's torch.cat of the whole history,
        # and the peak summed over the layers, were ~40 us of a 1.2 ms tiny.en step in a transcription)
        self._history = np.zeros((batch, self_kv[0].capacity if self_kv else 0), dtype=np.int64)
        self._held = 0
        self._peak = 0  # the Self-KV's bytes before the last time they fell (``note_peak``)
        self._reorder_layers = reorder_layers

    @property
    def tokens(self) -> torch.Tensor:
        """The ids whose keys and values the Self-KV holds [batch, positions]: a view of the history."""
        return torch.from_numpy(self._history[:, : self._held])

    @property
    def peak_self_kv_nbytes(self) -> int:
        """The most bytes the Self-KV held at any time: it only grows, but where rows are dropped or a
        layer is truncated (``note_peak`` is called before)."""
        return max(self._peak, self.self_kv_nbytes)

    def note_peak(self) -> None:
        """Take the Self-KV's bytes into the peak now: called before they fall."""
        self._peak = self.peak_self_kv_nbytes

    @property
    def offset(self) -> int:
        """Number of positions already held: the position index of the next token."""
        return self.self_kv[0].length if self.self_kv else 0

    @property
    def batch_size(self) -> int:
        return self._history.shape[0]

    def record_tokens(self, tokens: torch.Tensor) -> None:
        """Append ``tokens`` [batch, n], the ids of the positions just written to the Self-KV."""
        ids = (tokens if tokens.is_cpu else tokens.cpu()).numpy()
        batch, n = ids.shape
        if batch != self._history.shape[0]:
            raise ValueError(f"{batch} rows of tokens for a cache of {self._history.shape[0]} rows")
        if self._held + n > self._history.shape[1]:
            grown = np.zeros((batch, max(2 * self._history.shape[1], self._held + n)), dtype=np.int64)
            grown[:, : self._held] = self._history[:, : self._held]
            self._history = grown
        self._history[:, self._held : self._held + n] = ids
        self._held += n

    def reorder(self, rows: torch.Tensor) -> None:
        """Beams follow their parents: row i of every layer takes what row ``rows[i]`` held: through
        the backend's reorder of every layer at once where it takes them (a beam step's, the row count
        kept: ``cpu/reorder.py``); else layer by layer (its twin)."""
        moves = reorder_moves(rows)  # once for every layer (used where the row count stays)
        fast = self._reorder_layers
        if rows.shape[0] < self.batch_size:
            self.note_peak()  # rows dropped: the bytes held fall
        if fast is None or rows.shape[0] != self.batch_size or not fast(self.self_kv, moves):
            for kv in self.self_kv:
                kv.reorder(rows, moves)
        self._history = self._history[rows.to("cpu").numpy()]  # a copy: rows may repeat

    def keep_rows(self, rows: torch.Tensor, windows: torch.Tensor | None = None) -> None:
        """Keep only ``rows`` of the Self-KV and ``windows`` of the Cross-KV (default: ``rows``, a batch
        with one row per audio window; beams share their window's Cross-KV row).

        Windows of a batch finish at different steps; once dropped, a finished window no longer costs
        a Cross-KV and Self-KV read at every step of the others.
        """
        self.reorder(rows)
        windows = rows if windows is None else windows
        for i, kv in enumerate(self.cross_kv):  # one layer at a time, so a full copy never coexists
            self.cross_kv[i] = kv.rows(windows)

    def self_provenance(self, row: int = 0, layer: int = 0) -> SelfKVProvenance:
        """Every layer's Self-KV holds the same prefix; each attended to its own layer's Cross-KV."""
        return SelfKVProvenance(
            prefix=tuple(int(t) for t in self.tokens[row]),
            start_position=0,
            cross_kv=self.cross_kv[layer].provenance if self.cross_kv else None,
            request_id=self.request_id,
        )

    @property
    def self_kv_nbytes(self) -> int:
        return sum(kv.nbytes for kv in self.self_kv)

    @property
    def cross_kv_nbytes(self) -> int:
        return sum(kv.nbytes for kv in self.cross_kv)

    def layers(self) -> dict[str, list[LayerShape]]:
        """Per-layer shapes and bytes of both caches, for reports and ``inspect``."""
        return {
            "self_kv": [LayerShape(kv.layer, kv.shape, kv.nbytes) for kv in self.self_kv],
            "cross_kv": [LayerShape(kv.layer, kv.shape, kv.nbytes) for kv in self.cross_kv],
        }
