"""The engine: a transcription request as a job, and one scheduler that batches every job's decoder steps."""

from whisperkv.engine.handle import JobHandle
from whisperkv.engine.job import Job, WindowTask
from whisperkv.engine.options import TranscribeOptions
from whisperkv.engine.scheduler import Scheduler

__all__ = ["Job", "JobHandle", "Scheduler", "TranscribeOptions", "WindowTask"]
