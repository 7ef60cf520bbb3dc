"""The dataecho application: the ``dataecho`` command, its demo, training runs, upstreams and
sources (nginx, shards, Fashion-MNIST, Jane Austen), workloads and reports.

It needs the ``app`` extra (``pip install 'dataecho[app]'``); the library in :mod:`dataecho`
does not import it.
"""

# What the application needs beyond the library (the ``app`` extra in pyproject.toml).
APP_REQUIREMENTS = ("PIL", "matplotlib", "webdataset", "rdata")


def main() -> int:
    """Entry point of the ``dataecho`` console script: the command, once the extra is there."""
    import importlib.util
    import sys

    missing = [name for name in APP_REQUIREMENTS if importlib.util.find_spec(name) is None]
    if missing:
        print(f"dataecho: error: the command needs the app extra ({', '.join(missing)} missing); "
              "install it with: pip install 'dataecho[app]'", file=sys.stderr)  # fmt: skip
        return 2
    from dataecho.app.cli import main as cli_main

    return cli_main()
