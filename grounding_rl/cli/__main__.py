"""``python -m grounding_rl.cli`` = the ``grounding-rl`` command."""
import sys

from grounding_rl.cli import main

sys.exit(main())
