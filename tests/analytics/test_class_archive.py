"""The Spark class-data-sharing archive: where it lives, which JVM it belongs to, and when it is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics import class_archive


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(class_archive.ENV_SWITCH, raising=False)
    monkeypatch.delenv(class_archive.WRITE_ENV, raising=False)
    return tmp_path


def test_no_archive_means_no_options(cache: Path) -> None:
    path = class_archive.archive_path()
    assert path is not None and path.parent == cache / "kafkatap" and not path.exists()
    assert class_archive.java_options() == ""


def test_an_archive_is_used_unless_switched_off(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = class_archive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a real archive")
    assert f"-XX:SharedArchiveFile={path}" in class_archive.java_options()
    monkeypatch.setenv(class_archive.ENV_SWITCH, "0")
    assert class_archive.java_options() == ""


def test_the_key_follows_the_jvm(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another JVM (JAVA_HOME) gets another file: an archive is only valid for the JVM that wrote it."""
    first = class_archive.archive_path()
    fake = tmp_path / "jdk" / "bin"
    fake.mkdir(parents=True)
    (fake / "java").write_text("#!/bin/sh\n")
    (fake / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(fake.parent))
    assert class_archive.archive_path() not in (None, first)


def test_the_builders_child_writes_the_archive_instead_of_mapping_one(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build() runs a plain `analyze` child with WRITE_ENV set; its session must dump classes there, even over an old archive."""
    old = class_archive.archive_path()
    assert old is not None
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an archive being replaced")
    new = cache / "kafkatap" / ".new.jsa.tmp"
    monkeypatch.setenv(class_archive.ENV_SWITCH, "0")  # as build() sets it for the child
    monkeypatch.setenv(class_archive.WRITE_ENV, str(new))
    options = class_archive.java_options()
    assert options.startswith(f"-XX:ArchiveClassesAtExit={new} ") and "SharedArchiveFile" not in options
