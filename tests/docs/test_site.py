"""The documentation site: it builds with ``mkdocs build --strict``, and what it must hold.

One build (about 10 s on 2 cores) serves every test here: the API reference documents every
public name, the troubleshooting page has an entry for every error and each error's pointer
resolves to it, the settings page lists every ``nemogym-train`` setting, and the generated
environment table shows its placeholders. Without mkdocs (the ``docs`` extra) these skip.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import nemogym_sdk
from nemogym_sdk.errors import DOCS_URL, ConfigError, NemoGymError
from tests.docs.blocks import DOCS, REPO
from tests.test_error_tree import package_errors
from tests.test_public_api import SURFACE

pytestmark = pytest.mark.slow

REFERENCE_PAGES = {
    "nemogym_sdk": "core",
    "nemogym_sdk.errors": "errors",
    "nemogym_sdk.wire": "wire",
    "nemogym_sdk.grpo": "grpo",
    "nemogym_sdk.lora": "lora",
    "nemogym_sdk.gym": "gym",
    "nemogym_sdk.samplers": "samplers",
    "nemogym_sdk.processes": "processes",
    "nemogym_sdk.rollout_engine": "rollout-engine",
    "nemogym_sdk.train": "train",
    "nemogym_sdk.serve": "serve",
    "nemogym_sdk.serve.families": "serve-families",
    "nemogym_sdk.serve.parsers": "serve-parsers",
    "nemogym_sdk.testing": "testing",
    "nemogym_sdk.adapters.torch": "adapters-torch",
    "nemogym_sdk.adapters.trl": "adapters-trl",
    "nemogym_sdk.adapters.axolotl": "adapters-axolotl",
}
"""Each public package (the ``SURFACE`` of tests/test_public_api.py, and the error tree)
-> its page under docs/reference/."""
MACHINE_PATHS = ("/work/", "/root/", "/tmp/", "/home/", str(REPO))
_CITATION = re.compile(r"(?<![\w/.-])reference/[\w./-]+\.md\b")


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


hook = _load(DOCS / "hooks" / "train_config_page.py", "train_config_page")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site, built once with ``mkdocs build --strict`` (a warning fails it)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-5000:]}"
    yield out


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text()))


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "core" / "index.html").is_file()


def test_reference_pages_cover_every_public_package() -> None:
    assert set(REFERENCE_PAGES) == {*SURFACE, "nemogym_sdk.errors"}
    for package, page in REFERENCE_PAGES.items():
        text = (DOCS / "reference" / f"{page}.md").read_text()
        assert f"::: {package}\n" in text, f"docs/reference/{page}.md does not document {package}"


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    """Each name of each public ``__all__`` has its anchor in its package's page (as
    ``package.name``, or ``module.name`` where the page documents it from its module)."""
    missing = []
    for package, page in REFERENCE_PAGES.items():
        ids = _ids(site / "reference" / page / "index.html")
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            home = getattr(value, "__module__", None)
            if f"{package}.{name}" not in ids and f"{home}.{name}" not in ids:
                missing.append(f"{package}.{name}")
    assert not missing, f"not in the API reference (docs/reference/): {missing}"


def test_every_error_has_a_troubleshooting_entry(site: Path) -> None:
    """The pointer each error carries names an anchor of the troubleshooting page."""
    ids = _ids(site / "troubleshooting" / "index.html")
    errors = [c for c in package_errors().values() if issubclass(c, NemoGymError)]
    assert len(errors) > 30
    page = f"{DOCS_URL}troubleshooting/#"
    missing = []
    for cls in errors:
        url = cls.troubleshooting_url()
        assert url.startswith(page), url
        if url.removeprefix(page) != cls.__name__.lower() or url.removeprefix(page) not in ids:
            missing.append(cls.__name__)
    assert not missing, f"no entry in docs/troubleshooting.md for {sorted(missing)}"


def test_an_error_points_to_its_entry_without_changing_its_message() -> None:
    error = ConfigError("backend must be one of transformers, vllm, got 'x'")
    assert str(error) == "backend must be one of transformers, vllm, got 'x'"
    offline = "(offline: docs/troubleshooting.md in the source)"
    assert error.__notes__ == [f"See {DOCS_URL}troubleshooting/#configerror {offline}"]


_EMITTED_LINK = re.compile(r"\{DOCS_URL\}(?P<path>[\w/-]*)")


def test_every_docs_link_the_package_emits_is_a_page_the_build_produces(site: Path) -> None:
    """Each ``{DOCS_URL}<path>`` written in the package names a page of the built site, and
    the troubleshooting page's source is where an error's offline pointer says it is."""
    emitted = {
        match["path"].strip("/")
        for source in sorted((REPO / "nemogym_sdk").rglob("*.py"))
        for match in _EMITTED_LINK.finditer(source.read_text())
    }
    assert {"troubleshooting", "install", "reference/train-config"} <= emitted, emitted
    for path in emitted:
        assert (site / path / "index.html").is_file(), f"{DOCS_URL}{path}/ is not built"
    assert "docs/troubleshooting.md" in ConfigError("x").__notes__[0]
    assert (DOCS / "troubleshooting.md").is_file()


def test_the_docs_url_is_the_sites() -> None:
    config = (REPO / "mkdocs.yml").read_text()
    site_url = re.search(r"^site_url:\s*(\S+)", config, re.M)
    assert site_url is not None and site_url[1] == DOCS_URL


def test_the_settings_page_lists_every_setting(site: Path) -> None:
    """Every ``TrainConfig`` field has a docstring and a row (its flag) on the page."""
    import attrs

    from nemogym_sdk.train.config import TrainConfig

    names = [field.name for field in attrs.fields(TrainConfig)]
    undocumented = [name for name in names if not hook.field_docstrings().get(name)]
    assert not undocumented, f"TrainConfig fields without a docstring: {undocumented}"
    html = (site / "reference" / "train-config" / "index.html").read_text()
    for name in names:
        assert f"<code>--{name.replace('_', '-')}</code>" in html, name


def test_no_citation_of_a_missing_reference_note() -> None:
    """``reference/...md`` in the package or the docs names a page of the site."""
    generated = {hook.PAGE}
    sources = [*REPO.joinpath("nemogym_sdk").rglob("*.py"), *DOCS.rglob("*.md")]
    sources += [*REPO.joinpath("nemogym_sdk").rglob("*.md"), REPO / "README.md"]
    missing = [
        f"{path.relative_to(REPO)}: {cited}"
        for path in sources
        for cited in _CITATION.findall(path.read_text())
        if cited not in generated and not (DOCS / cited).is_file()
    ]
    assert not missing, f"citations of files that are not in the repository: {missing}"


def test_the_environment_table_shows_its_placeholders(site: Path) -> None:
    html = (site / "gym-environments" / "index.html").read_text()
    assert "http://127.0.0.1:/" not in html
    assert "127.0.0.1:&lt;port&gt;" in html
    page = (DOCS / "gym-environments.md").read_text()
    assert not [p for p in MACHINE_PATHS if p in page.split("<!-- gym-sweep:begin -->")[1]]


def test_the_sweep_table_has_no_machine_paths() -> None:
    """What ``benchmarks/gym_sweep.py`` writes into the page: no path of the machine that ran
    it, and placeholders that markdown shows rather than takes for HTML tags."""
    sweep = _load(REPO / "benchmarks" / "gym_sweep.py", "gym_sweep")
    reasons = [
        f"failed to fetch into: /root/.cache/uv/git-v2/db/297d2e6b; see {REPO}/benchmarks/x.py",
        "HTTP 500 from http://127.0.0.1:40123/run: '/tmp/tmpab_12/logs/a.log' not found",
        "/home/someone/venvs/nemo/lib/python3.13/site-packages/x/y.py: /work/other/z and /tmp/q",
        "run `python -m playwright install chromium` at /srv/server-envs/env-1a2b/bin/python",
    ]
    outcomes = [
        sweep.Outcome(environment=f"e{i}", outcome="start", reason=r, seconds=1)
        for i, r in enumerate(reasons)
    ]
    text = sweep.table(outcomes, command="python benchmarks/gym_sweep.py")
    assert not [p for p in MACHINE_PATHS if p in text], text
    assert "127.0.0.1:&lt;port&gt;/run" in text and "<" not in text.replace("<!--", "")
    assert "`python -m playwright install chromium`" in text
    assert "benchmarks/x.py" in text and "~/.cache/uv" in text


def test_mkdocs_yml_is_valid_yaml_with_the_snippet_base_at_the_root() -> None:
    """pymdownx.snippets resolves ``--8<--`` paths from the repository root, and refuses
    a missing file (``check_paths``)."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)
    snippets = next(
        e["pymdownx.snippets"]
        for e in config["markdown_extensions"]
        if isinstance(e, dict) and "pymdownx.snippets" in e
    )
    assert snippets["check_paths"] is True and snippets["base_path"] == ["."]


def test_the_core_page_leads_with_what_a_user_starts_from(site: Path) -> None:
    """The core API page opens with the classes a trainer starts from, in that order, and
    ends with the errors and the version; no module internals (``__getattr__``) show."""
    html = (site / "reference" / "core" / "index.html").read_text()
    documented = [
        name
        for name in re.findall(r'\bid="nemogym_sdk\.(?:collate\.)?([\w]+)"', html)
        if name in nemogym_sdk.__all__
    ]
    documented = list(dict.fromkeys(documented))
    assert documented[:2] == ["AgentClient", "TaskRow"], documented[:6]
    for first, later in [
        ("AgentClient", "Rollout"),
        ("Rollout", "Batch"),
        ("Batch", "ConfigError"),
    ]:
        assert documented.index(first) < documented.index(later), documented
    assert documented.index("LoraSync") < documented.index("NemoGymError")
    assert documented[-1] == "__version__"
    assert sorted(documented) == sorted(nemogym_sdk.__all__)
    assert 'id="nemogym_sdk.__getattr__"' not in html
