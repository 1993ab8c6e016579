"""Start the explorer from the installed package: ``sat-explorer`` runs ``streamlit run`` on its app.py.

    sat-explorer                                        # http://localhost:8501, the shipped checkpoints
    sat-explorer --checkpoints runs/a/best --data my/dataset.json --images my/images
    sat-explorer --world data/scenes --server.port 8502

Options with a dot (``--server.port 8502``) go to Streamlit; the others are the app's own (see
explorer.settings: --checkpoints, --data, --images, --split, --world, --device). The project's server
settings (the repository's .streamlit/config.toml, or its copy inside the installed package) are passed
as Streamlit options, since Streamlit itself reads that file only from the folder it is started in;
options given here come after them and win.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
APP = HERE / "app.py"
# The installed copy (written by setup.py's build step), else the repository's own file.
SERVER_CONFIGS = (HERE / "streamlit_config.toml", HERE.parent / ".streamlit" / "config.toml")


def server_options(configs: Sequence[Path] = SERVER_CONFIGS) -> list[str]:
    """The first existing config.toml as Streamlit command-line options (``--section.key=value``)."""
    for path in configs:
        if path.is_file():
            tables = tomllib.loads(path.read_text(encoding="utf-8"))
            return [f"--{section}.{key}={_text(value)}"
                    for section, table in tables.items() for key, value in table.items()]
    return []


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(Streamlit's options, the app's arguments): an option with a dot in its name is Streamlit's."""
    streamlit, app = [], []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name = arg.split("=", 1)[0]
        if name.startswith("--") and "." in name:
            streamlit.append(arg if "=" in arg or not args else f"{arg}={args.pop(0)}")
        else:
            app.append(arg)
    return streamlit, app


def streamlit_argv(argv: Sequence[str]) -> list[str]:
    """The arguments ``streamlit`` is run with for ``sat-explorer ARGV``."""
    streamlit, app = split_args(argv)
    return ["run", str(APP), *server_options(), *streamlit, "--", *app]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    from streamlit.web import cli

    return cli.main(args=streamlit_argv(argv), prog_name="streamlit")  # exits when the server stops


if __name__ == "__main__":
    sys.exit(main())
