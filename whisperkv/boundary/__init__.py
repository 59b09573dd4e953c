"""Encoder and decoder across a trust boundary (issue 11): what crosses is sealed and bound to its provenance.

Read in this order: ``associated_data`` (the label of a sealed part), ``keys`` (the 32-byte secret and
HKDF session keys bound to both sides' nonces and the worker's measurement), ``handshake`` (a hello
authenticated before the worker keeps anything), ``sealing`` (AES-256-GCM blobs), ``replay`` (a blob
opens once), ``protocol`` (what crosses per window in each carry mode), ``sessions`` (capped, expiring),
``request_body`` (bounded in size and time), ``worker`` (the FastAPI encoder worker), ``client``
(``RemoteEncoder``, the decoder's side), ``costs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from whisperkv.boundary.client import RemoteEncoder

__all__ = ["RemoteEncoder"]


def __getattr__(name: str):  # noqa: ANN202 - lazy: the cache store imports ``costs`` without httpx
    if name == "RemoteEncoder":
        from whisperkv.boundary.client import RemoteEncoder

        return RemoteEncoder
    raise AttributeError(name)
