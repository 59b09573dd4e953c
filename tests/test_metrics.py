from whisperkv.metrics import edit_distance, normalize_text, wer


def test_normalize_text_drops_case_and_punctuation_but_keeps_apostrophes():
    assert normalize_text("Hello, World! It's  'quoted' -- forty-two.") == "hello world it's quoted forty two"


def test_edit_distance_counts_substitutions_insertions_deletions():
    assert edit_distance("a b c".split(), "a b c".split()) == 0
    assert edit_distance("a b c".split(), "a x c".split()) == 1
    assert edit_distance("a b c".split(), "a c".split()) == 1
    assert edit_distance("a b".split(), "a b c d".split()) == 2
    assert edit_distance([], "a b".split()) == 2


def test_wer_is_relative_to_reference_length():
    assert wer("the cat sat on the mat", "The cat sat on a mat.") == 1 / 6
