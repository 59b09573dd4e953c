"""The symbols Whisper keeps out of a transcript by default, and the token ids that would start them.

Its decoder learned speaker tags, sound annotations and music notes from subtitles ("[MUSIC]", "(laughs)",
"♪"); the reference suppresses the tokens that open them so that nothing is written that was not spoken.
The rule lives here, apart from the tokenizer, because it is a decoding policy on top of a vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

# Symbols the reference suppresses by default so that the decoder does not invent speaker tags,
# sound-effect annotations or music notes that were not spoken.
NON_SPEECH_SYMBOLS = (
    *'"#()*+/:;<=>@[\\]^_`{|}~「」『』',
    *"<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split(),
)
# Musical symbols (U+2640..U+267F block). Tokenizers may split them into several byte tokens; the first
# token is then shared by the whole block, so suppressing it is safe.
MUSICAL_SYMBOLS = "♩♪♫♬♭♮♯"


def non_speech_token_ids(encode: Callable[[str], list[int]]) -> tuple[int, ...]:
    """Sorted ids that would start a speaker tag, sound annotation or music note, e.g. "[MUSIC]".

    The rule is the reference's, so default decoding suppresses the very same ids: for each symbol,
    both with and without a leading space, take its encoding if that is a single token; for the
    musical symbols take the first token even if split. Plain punctuation (, . ? !) stays allowed,
    and so do "-" and "'" inside words, but not " -" or " '" opening one.
    """
    result = {encode(" -")[0], encode(" '")[0]}
    for symbol in [*NON_SPEECH_SYMBOLS, *MUSICAL_SYMBOLS]:
        for ids in (encode(symbol), encode(" " + symbol)):
            if len(ids) == 1 or symbol in MUSICAL_SYMBOLS:
                result.add(ids[0])
    return tuple(sorted(result))
