"""``python -m topocoll``: the same command line as the ``topocoll`` console script."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
