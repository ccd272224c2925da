"""tests/ mirrors the source tree: the tests of app/desktop/chat/ are in tests/app/desktop/chat/,
so the test of a module is found by its path. At tests/ itself sit only the shared helpers and
fixtures; repository-wide checks are in tests/repo/, the packaging's in tests/packaging/, the
long drive's in tests/drive/, and the file readers' fuzz corpus in tests/fuzz_corpus/."""

from repo_paths import REPO, TESTS

MIRRORED = ("app", "engine", "kernels")
OWN_FOLDERS = {"repo", "packaging", "drive", "fuzz_corpus", "__pycache__"}


def test_no_test_module_sits_loose_at_the_top():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], f"move these under the folder of what they test: {loose}"


def test_every_test_folder_mirrors_a_source_folder():
    strays = []
    for folder in TESTS.iterdir():
        if not folder.is_dir() or folder.name in OWN_FOLDERS:
            continue
        if folder.name not in MIRRORED:
            strays.append(folder.name)
            continue
        for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            if any(part == "__pycache__" or part.startswith(".") for part in sub.parts):
                continue  # caches: pytest's, hypothesis'

            if not (REPO / sub.relative_to(TESTS)).is_dir():
                strays.append(str(sub.relative_to(TESTS)))
    assert strays == [], f"test folders with no source folder of that path: {strays}"
