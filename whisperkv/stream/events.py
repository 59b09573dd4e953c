"""What a stream emits: words with times, and events that carry them.

Times are seconds from the start of the stream. ``audio_time`` is the stream time at which the event
was emitted (how much audio had arrived by then), so a commit's latency is ``audio_time - end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: event types a session emits; ``partial`` and ``commit`` are the ones ``whisperkv stream --json`` prints
EVENT_TYPES = ("partial", "commit", "speech_started", "speech_stopped", "utterance_end")


@dataclass(frozen=True)
class Word:
    text: str  # as the tokenizer spells it, usually with its leading space
    start: float
    end: float
    #: the model's probability of the word's tokens, or of the punctuation attached to it where that is
    #: lower (``timing``'s ``probability_with_marks``), where a decode gave one
    probability: float | None = field(default=None, compare=False)

    @property
    def ends_sentence(self) -> bool:
        return self.text.rstrip().endswith((".", "?", "!"))


@dataclass
class Event:
    type: str
    text: str = ""
    start: float = 0.0
    end: float = 0.0
    audio_time: float = 0.0
    words: list[Word] = field(default_factory=list)

    @classmethod
    def of_words(cls, kind: str, words: list[Word], audio_time: float) -> Event:
        return cls(kind, join_words(words), words[0].start, words[-1].end, audio_time, list(words))

    def as_json(self) -> dict:
        """The line ``whisperkv stream --json`` prints for this event."""
        return {
            "type": self.type,
            "text": self.text,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "audio_time": round(self.audio_time, 3),
        }


def join_words(words: list[Word]) -> str:
    return "".join(w.text for w in words).strip()
