"""``python -m topocoll.cluster`` is ``topocoll cluster``."""
import sys

from .cli import main

sys.exit(main())
