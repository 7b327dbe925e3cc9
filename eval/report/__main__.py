"""``python -m eval.report``: the command line, :func:`eval.report.cli.main`."""
import sys

from eval.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
