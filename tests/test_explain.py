"""`whisperkv explain`: the page's numbers are transcription's and inspect's; its images and page render."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib import image as mpimg

from tests.conftest import SPEECH_DIR
from whisperkv.cli import main
from whisperkv.explain.figures import draw_all
from whisperkv.explain.page import render_page
from whisperkv.explain.trace import trace_window
from whisperkv.inspect import inspect_caches

JFK = SPEECH_DIR / "en" / "jfk.flac"
SHORT = SPEECH_DIR / "en" / "ls_1089-134686-0001.flac"


@pytest.fixture(scope="module")
def trace(tiny_model):
    if not JFK.is_file():
        pytest.skip("speech set not found")
    return trace_window(tiny_model, str(JFK))


@pytest.fixture(scope="module")
def page(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("explain")
    images = draw_all(trace, out)
    (out / "index.html").write_text(render_page(trace, images))
    return out, images


def test_tokens_and_probabilities_are_transcriptions(trace, tiny_model):
    result = tiny_model.transcribe(str(JFK), word_timestamps=True)
    (segment_tokens,) = {tuple(t for s in result["segments"] for t in s["tokens"])}
    sampled = [s.token for s in trace.steps]
    assert trace.tokens_match is True
    assert tuple(sampled[: len(segment_tokens)]) == segment_tokens
    assert sampled[-1] == tiny_model.tokenizer.eot
    # the decoder's score of the sequence: mean log-probability over sampled tokens + end of text
    mean_logprob = sum(math.log(s.probability) for s in trace.steps) / len(trace.steps)
    assert mean_logprob == pytest.approx(result["segments"][0]["avg_logprob"], abs=1e-4)
    assert trace.avg_logprob == pytest.approx(result["segments"][0]["avg_logprob"], abs=1e-6)
    assert [w["word"] for w in trace.words] == [w["word"] for s in result["segments"] for w in s["words"]]
    assert [w["start"] for w in trace.words] == [w["start"] for s in result["segments"] for w in s["words"]]
    for step in trace.steps:  # the chosen token is at most as likely as the best alternative
        assert step.top[0][2] >= step.probability - 1e-6 and len(step.top) == 5


def test_cache_bytes_match_inspect(trace):
    positions = len(trace.prompt) + len(trace.self_kv_bytes) - 1  # every call but the last fed its token
    report = inspect_caches("tiny.en", 1, positions, "float32")
    assert trace.cross_kv_bytes == [layer["bytes"] for layer in report["cross_kv"]]
    assert trace.self_kv_bytes[-1] == [layer["bytes"] for layer in report["self_kv"]]
    per_token = 2 * 384 * 4  # keys and values, d = 384, float32
    growth = np.diff(np.array(trace.self_kv_bytes), axis=0)
    assert (growth == per_token).all()
    assert trace.reorders == []


def test_beam_search_trace(tiny_model):
    beam = trace_window(tiny_model, str(SHORT), beam_size=5)
    result = tiny_model.transcribe(str(SHORT), beam_size=5)
    tokens = [t for s in result["segments"] for t in s["tokens"]]
    assert beam.tokens_match is True and [s.token for s in beam.steps][: len(tokens)] == tokens
    assert beam.reorders, "beam search moved no Self-KV row"
    positions = len(beam.prompt) + len(beam.self_kv_bytes) - 1
    report = inspect_caches("tiny.en", 5, positions, "float32")
    assert beam.self_kv_bytes[-1] == [layer["bytes"] for layer in report["self_kv"]]
    assert beam.cross_kv_bytes == [
        layer["bytes"] for layer in inspect_caches("tiny.en", 1, 0, "float32")["cross_kv"]
    ]


def test_every_image_is_a_readable_png(page):
    out, images = page
    assert set(images) == {
        "waveform",
        "log_mel",
        "encoder_output",
        "cross_attention",
        "cache_growth",
        "waterfall",
    }
    for name in images.values():
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = mpimg.imread(path)
        height, width = pixels.shape[:2]
        assert width >= 1000 and 200 <= height <= 1200, (name, pixels.shape)
        assert pixels[..., :3].std() > 0.05, f"{name} is nearly uniform"
        html = (out / "index.html").read_text()
        assert f'src="{name}"' in html


def test_page_states_the_numbers(page, trace):
    html = (page[0] / "index.html").read_text()
    assert trace.weights_digest in html and trace.provenance["mel_digest"] in html
    assert f"{sum(trace.cross_kv_bytes):,} B" in html
    for step in trace.steps:
        assert f"{step.probability:.4f}" in html
    assert "identical to transcription" in html


def test_page_renders_in_a_real_browser(page, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/setup.sh installs it)")
        pytest.skip("chromium not installed")
    shot = tmp_path / "shot.png"
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,2400",
        f"--screenshot={shot}",
        (page[0] / "index.html").as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)
    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1280)
    not_white = (pixels < 0.95).any(axis=-1).mean()
    assert not_white > 0.10, f"only {not_white:.1%} of the screenshot is drawn"
    assert pixels.std() > 0.1


def test_cli_json_and_errors(trace, capsys, tmp_path, tiny_model):
    assert main(["explain", str(JFK), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["token"] for s in data["steps"]] == [s.token for s in trace.steps]
    assert data["cross_kv_bytes"] == trace.cross_kv_bytes and data["shapes"]["mel"] == [80, 3000]
    # the window's text: what was said in it (the clip's words), and the text of its own tokens
    assert "ask not what your country can do for you" in data["text"].lower()
    assert data["text"] == trace.text == "".join(s["text"] for s in data["segments"])
    assert data["text"].strip() == tiny_model.tokenizer.decode(data["result_tokens"]).strip()
    assert main(["explain", str(SHORT), "--window", "3"]) == 2
    assert "has 1 decoded window(s), 0 to 0" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "missing.wav")]) == 2
    assert "missing.wav" in capsys.readouterr().err
