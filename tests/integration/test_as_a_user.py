"""The README's commands as a newcomer runs them: a user that is not root, on a copy of the
repository, with the system's Python (PEP 668's externally managed one on Debian and Ubuntu)
and nothing installed for it. `make` makes its own virtual environment and installs into it;
the tools then work from there. Run as root (CI), the test makes a user for the purpose and
removes it afterwards; run as a user, it runs as that user.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The PATH of a fresh login: the system's programs and Go, nothing of this process.
USER_PATH = "/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin"


class User:
    """Runs commands as an unprivileged user with a clean environment and its own HOME."""

    def __init__(self, name: str | None, home: Path) -> None:
        self.name = name
        self.home = home
        self.transcript: list[str] = []

    def run(
        self, *argv: str | Path, cwd: Path, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        env = ["env", "-i", f"PATH={USER_PATH}", f"HOME={self.home}", "LANG=C.UTF-8"]
        prefix = ["runuser", "-u", self.name, "--"] if self.name else []
        result = subprocess.run(
            [*prefix, *env, *map(str, argv)],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        who = self.name or "user"
        self.transcript.append(f"{who}@{cwd.name}$ {' '.join(map(str, argv))}")
        self.transcript.extend((result.stdout + result.stderr).splitlines())
        self.transcript.append(f"(exit {result.returncode})")
        return result


def _copy_of_the_repository(into: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new files not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@pytest.fixture
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[User, Path]]:
    base = Path(
        subprocess.run(
            ["mktemp", "-d", "/tmp/gangcheck-newcomer.XXXXXX"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    base.chmod(0o755)
    home, clone = base / "home", base / "gangcheck"
    home.mkdir()
    _copy_of_the_repository(clone)
    name = None
    if os.geteuid() == 0:
        name = f"gc-newcomer-{secrets.token_hex(3)}"
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
             "--shell", "/usr/sbin/nologin", name],
            check=True,
        )  # fmt: skip
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home), str(clone)], check=True)
    try:
        yield User(name, home), clone
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if name is not None:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.timeout(420)
def test_make_installs_into_its_own_venv_as_a_user_with_the_system_python(
    newcomer: tuple[User, Path],
) -> None:
    user, clone = newcomer
    system_python = user.run("sh", "-c", "command -v python3", cwd=clone).stdout.strip()
    assert system_python, "no python3 on the system PATH"
    assert user.run("id", "-u", cwd=clone).stdout.strip() != "0" or os.geteuid() != 0

    transcript = _ok(user.run("make", "install", cwd=clone, timeout=360))
    venv = clone / ".venv"
    assert "making the virtual environment .venv" in transcript
    assert (venv / ".installed").is_file()
    prefix = _ok(
        user.run(venv / "bin" / "python", "-c", "import sys; print(sys.prefix)", cwd=clone)
    )
    assert Path(prefix.strip()) == venv

    # Nothing went into the system's Python: it cannot import gangcheck.
    elsewhere = user.run(system_python, "-c", "import gangcheck", cwd=user.home)
    assert elsewhere.returncode != 0 and "ModuleNotFoundError" in elsewhere.stderr

    assert (
        _ok(user.run(venv / "bin" / "gangcheck", "--version", cwd=clone)).strip()
        == "gangcheck 0.1.0"
    )
    assert "demo" in _ok(user.run(venv / "bin" / "gangcheck-dev", "--help", cwd=clone))
    missing = user.run(venv / "bin" / "gangcheck", "status", "--kubeconfig", "nowhere", cwd=clone)
    assert (missing.returncode, missing.stderr) == (1, "gangcheck: kubeconfig nowhere not found\n")

    # Make's targets use the environment: the linter runs from it, on the copy.
    assert "All checks passed" in _ok(user.run("make", "lint", cwd=clone, timeout=240))
    help_text = _ok(user.run("make", "help", cwd=clone))
    assert "kueue-metrics-cert" in help_text and "demo" in help_text
    print("\n".join(user.transcript), file=sys.stderr)  # shown with -s, or on a failure
