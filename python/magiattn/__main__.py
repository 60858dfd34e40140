"""``python -m magiattn``: what this build has and sees (magiattn.info)."""
import sys

from .info import main

sys.exit(main())
