"""``python -m eval.site``: the command line, :func:`eval.site.cli.main`."""
import sys

from eval.site.cli import main

if __name__ == "__main__":
    sys.exit(main())
