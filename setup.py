"""The one packaging step pyproject.toml cannot state: files the repository keeps outside the packages
travel inside them when installed, where the code looks for them (sat_core.paths.shipped_checkpoints,
explorer.launch.SERVER_CONFIGS). An editable install (pip install -e .) reads them in the repository."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# repository path -> its place inside the installed packages
OUTSIDE_THE_PACKAGES = {
    "checkpoints": "sat_core/checkpoints",
    ".streamlit/config.toml": "explorer/streamlit_config.toml",
}


class BuildPyWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for source, target in OUTSIDE_THE_PACKAGES.items():
            # An earlier build's copy goes first: a checkpoint deleted since must not travel on from build/.
            shutil.rmtree(Path(self.build_lib, target), ignore_errors=True)
            for path in _files(Path(source)):
                dest = Path(self.build_lib, target) / path.relative_to(source)  # a file: the target itself
                self.mkpath(str(dest.parent))
                self.copy_file(str(path), str(dest))


def _files(source: Path) -> list[Path]:
    """A file, or the files under a folder; hidden ones (a checkpoint's staging or replaced copy) left out."""
    if source.is_file():
        return [source]
    return sorted(p for p in source.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(source).parts))


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
