"""The network in plain PyTorch, top to bottom as the seed draws it: dimensions, attention, encoder,
decoder, and the Whisper module that joins them. It names no kernel: a backend runs its steps through
the decoder's ``StepPlan`` (``model/decoder.py``; the CPU's is ``cpu/plan.py``). Loading, and the
choice of backend, is ``whisperkv/load.py``."""

from whisperkv.model.dims import KNOWN_DIMS, ModelDims
from whisperkv.model.whisper import Whisper

__all__ = ["KNOWN_DIMS", "ModelDims", "Whisper"]
