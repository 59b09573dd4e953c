"""openai-whisper's own test suite, run against ``import whisperkv as whisper``.

The tests come from openai-whisper's source distribution on PyPI (release 20250625, its ``tests/``),
downloaded once with pip into ``.cache/`` (no model hub, nothing of theirs committed here), checked
against a pinned SHA-256, copied to a temporary folder with every ``import whisper`` / ``from whisper``
read as whisperkv, and run by pytest in a child process. The sdist carries no audio: ``jfk.flac`` is the
same clip from the speech set (its manifest names openai/whisper ``tests/jfk.flac`` as the source).

Only the tests marked ``requires_cuda`` are deselected. ``test_transcribe`` runs once per name in
``whisperkv.available_models()``: tiny.en and base.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import SPEECH_DIR, running_in_ci

RELEASE = "20250625"
SDIST = f"openai_whisper-{RELEASE}.tar.gz"
SDIST_SHA256 = "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("WHISPERKV_REFERENCE_CACHE", REPO_ROOT / ".cache"))

#: every reference test file and how many of its tests run on the CPU (with tiny.en and base installed)
EXPECTED = {
    "test_audio.py": 1,
    "test_normalizer.py": 4,
    "test_timing.py": 8,
    "test_tokenizer.py": 4,
    "test_transcribe.py": 2,
}
#: the reference's CUDA-only tests: dtw_cuda and median_filter on the GPU, 4 shapes each
CUDA_ONLY = 8

_IMPORT = re.compile(r"^import whisper$", re.MULTILINE)
_FROM = re.compile(r"^from whisper(?=[. ])", re.MULTILINE)
_ANY_WHISPER = re.compile(r"^\s*(import|from) whisper\b(?!kv)", re.MULTILINE)


def _unavailable(reason: str) -> None:
    """Locally a missing download skips; under CI it fails, so the suite cannot silently not run."""
    if running_in_ci():
        pytest.fail(f"{reason}; CI is set, so the reference suite must run", pytrace=False)
    pytest.skip(reason)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reference_sdist() -> Path:
    """openai-whisper's sdist from PyPI, fetched by pip once and kept in the cache folder."""
    path = CACHE_DIR / SDIST
    if not path.is_file() or _sha256(path) != SDIST_SHA256:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps"]
        command += [f"openai-whisper=={RELEASE}", "-d", str(CACHE_DIR)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            _unavailable("pip download of the openai-whisper sdist took over 300 s")
        if done.returncode != 0 or not path.is_file():
            _unavailable(f"pip could not download {SDIST}: {done.stderr.strip()[-500:]}")
    digest = _sha256(path)
    assert digest == SDIST_SHA256, f"{path}: SHA-256 {digest}, expected the pinned {SDIST_SHA256}"
    return path


def rewrite_imports(source: str) -> str:
    """``import whisper`` → ``import whisperkv as whisper``; ``from whisper.x`` → ``from whisperkv.x``."""
    return _FROM.sub("from whisperkv", _IMPORT.sub("import whisperkv as whisper", source))


def extract_tests(sdist: Path, into: Path) -> list[str]:
    """The sdist's ``tests/*.py`` (nothing else, no paths of its choosing), rewritten to whisperkv."""
    prefix = f"openai_whisper-{RELEASE}/tests/"
    names = []
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            name = member.name.removeprefix(prefix)
            if (
                not member.isfile()
                or not member.name.startswith(prefix)
                or not re.fullmatch(r"\w+\.py", name)
            ):
                continue
            source = rewrite_imports(archive.extractfile(member).read().decode("utf-8"))
            assert not _ANY_WHISPER.search(source), (
                f"{name}: an import of openai-whisper was left unrewritten"
            )
            (into / name).write_text(source, encoding="utf-8")
            names.append(name)
    return sorted(names)


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory) -> dict:
    """Run the rewritten suite once; per file, the outcome of each test case, and pytest's summary."""
    sdist = reference_sdist()
    jfk = SPEECH_DIR / "en" / "jfk.flac"
    if not jfk.is_file():
        _unavailable(f"{jfk} (the reference tests' clip) is missing")
    folder = tmp_path_factory.mktemp("openai_whisper_tests")
    files = extract_tests(sdist, folder)
    shutil.copyfile(jfk, folder / "jfk.flac")
    # an ini of its own: the marker registered, and this repository's addopts (-n 2, -m 'not slow') unread
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    requires_cuda: needs a CUDA device\n")
    report = folder / "report.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not requires_cuda"]
    command += [f"--junitxml={report}", str(folder)]
    # whisperkv from this checkout, whether or not it is installed (the child runs in the temporary folder)
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    outcomes: dict[str, dict[str, str]] = {name: {} for name in files}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        file = case.get("classname", "").split(".")[-1] + ".py"
        detail = "".join((child.get("message") or "") + (child.text or "")[-1500:] for child in case)
        outcomes.setdefault(file, {})[case.get("name", "")] = kinds[0] + ": " + detail if kinds else "passed"
    return {"files": files, "outcomes": outcomes, "stdout": done.stdout, "returncode": done.returncode}


def test_sdist_holds_the_reference_tests(suite_run):
    assert suite_run["files"] == sorted(EXPECTED)


def test_import_rewrite_reads_whisper_as_whisperkv():
    source = "import whisper\nfrom whisper.tokenizer import get_tokenizer\nfrom whisper import audio\n"
    assert rewrite_imports(source).splitlines() == [
        "import whisperkv as whisper",
        "from whisperkv.tokenizer import get_tokenizer",
        "from whisperkv import audio",
    ]
    assert rewrite_imports("import whisperx\n") == "import whisperx\n"


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_reference_file_passes(suite_run, file):
    cases = suite_run["outcomes"].get(file, {})
    problems = {name: outcome for name, outcome in cases.items() if outcome != "passed"}
    assert not problems, f"{file}: {problems}\n{suite_run['stdout'][-3000:]}"
    assert len(cases) == EXPECTED[file], f"{file}: ran {sorted(cases)}"


def test_whole_suite_summary(suite_run):
    """Every reference test but the CUDA-only ones ran and passed, transcribe on tiny.en and base."""
    summary = suite_run["stdout"].strip().splitlines()[-1]
    counts = Counter({kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", summary)})
    assert suite_run["returncode"] == 0, suite_run["stdout"][-3000:]
    assert counts["passed"] == sum(EXPECTED.values()) and counts["deselected"] == CUDA_ONLY, summary
    assert sorted(suite_run["outcomes"]["test_transcribe.py"]) == [
        "test_transcribe[base]",
        "test_transcribe[tiny.en]",
    ]
