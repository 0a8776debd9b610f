"""Fetching Debian's index files with `apt-get update` into a private directory of the project.

Never the system's apt lists: a private config and `Dir::State::Lists` under the data dir keep
everything there. One language per data dir (`apt-get update` deletes the index files it was not
asked for): the English descriptions in data/debian, the German ones (mt task) in their own.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from attnlab.errors import DataError
from tasks.common.debian.translation import APT_HELPER

_OFFLINE_HELP = (
    "Fetch the corpus on a machine with Debian's apt and network access (`make data`, which runs "
    "`python -m tasks.common.debian --data-dir data/debian`) and copy the data dir here, or train "
    "on your own plain-text files instead: task.data.files=[path/a.txt,path/b.txt]"
)


def apt_command(data_dir: Path, language: str = "en", packages: bool = False) -> list[str]:
    """`apt-get update` that writes only under data_dir and fetches only the descriptions in
    `language` (Translation-<language>; the German ones for the mt task are `de`).

    One language per data_dir: `apt-get update` deletes the index files it was not asked for.
    `packages=True` also fetches the Packages indexes (section, source, Description-md5 of every
    binary package of the machine's architecture), which the `classify` task labels with.
    """
    data_dir = data_dir.resolve()
    return [
        "apt-get",
        # Private config: clears the system's update hooks (packagekit, appstream) so that
        # nothing outside data_dir is touched; see _write_private_conf.
        "-c", str(data_dir / "apt.conf"),
        "-o", f"Dir::State::Lists={data_dir / 'apt-lists'}",  # the index files and their lock
        "-o", f"Dir::Cache={data_dir / 'apt-cache'}",
        "-o", "Dir::Cache::pkgcache=",  # no binary package caches
        "-o", "Dir::Cache::srcpkgcache=",
        "-o", f"Acquire::Languages={language}",
        # Only Translation-<language> (and Packages if asked): no other index is needed.
        "-o", f"Acquire::IndexTargets::deb::Packages::DefaultEnabled={str(packages).lower()}",
        "-o", "Acquire::IndexTargets::deb-src::Sources::DefaultEnabled=false",
        "-o", "Acquire::http::Timeout=30",
        "-o", "Acquire::Retries=2",
        "update",
    ]


def _write_private_conf(data_dir: Path) -> None:
    (data_dir / "apt-lists" / "partial").mkdir(parents=True, exist_ok=True)
    (data_dir / "apt-cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (data_dir / "apt.conf").write_text(
        "// written by tasks.common.debian: keep `apt-get update` from running system hooks\n"
        "#clear APT::Update::Pre-Invoke;\n"
        "#clear APT::Update::Post-Invoke;\n"
        "#clear APT::Update::Post-Invoke-Success;\n"
    )


def translation_files(data_dir: Path, language: str = "en") -> list[Path]:
    return sorted((Path(data_dir) / "apt-lists").glob(f"*Translation-{language}*"))


def packages_files(data_dir: Path) -> list[Path]:
    return sorted((Path(data_dir) / "apt-lists").glob("*_Packages*"))


def fetch(data_dir: str | Path, language: str = "en", packages: bool = False) -> list[Path]:
    """Run `apt-get update` into data_dir/apt-lists; return the Translation-<language> files.

    `packages=True`: fetch the Packages indexes too (see `apt_command`; `packages_files` lists them).
    """
    data_dir = Path(data_dir)
    if shutil.which("apt-get") is None or not Path(APT_HELPER).exists():
        raise DataError(f"the Debian corpus needs Debian's apt-get, which this machine lacks. {_OFFLINE_HELP}")
    data_dir.mkdir(parents=True, exist_ok=True)
    _write_private_conf(data_dir)
    cmd = apt_command(data_dir, language, packages)
    what = f"Translation-{language} package descriptions" + (" and the Packages indexes (~9 MB)" if packages else "")
    print(f"[debian] fetching {what} into {data_dir / 'apt-lists'}:")
    print("[debian]   " + " ".join(cmd), flush=True)
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise DataError(f"`apt-get update` did not finish in 10 minutes (offline?). {_OFFLINE_HELP}")
    for line in proc.stdout.splitlines():
        if line.startswith(("Get:", "Hit:", "Fetched", "Ign:", "Err:")):
            print(f"[debian]   {line}")
    files = translation_files(data_dir, language)
    if proc.returncode != 0 or not files or (packages and not packages_files(data_dir)):
        detail = (proc.stderr.strip() or proc.stdout.strip())[-800:]
        raise DataError(
            f"`apt-get update` could not fetch the Translation-{language}{' and Packages' if packages else ''} "
            f"files (exit {proc.returncode}):\n"
            f"{detail}\n{_OFFLINE_HELP}"
        )
    print(f"[debian] fetched {len(files)} Translation-{language} files in {time.time() - start:.1f} s", flush=True)
    return files
