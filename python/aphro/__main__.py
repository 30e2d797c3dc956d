"""``python -m aphro ...`` == the ``aphro`` console script."""
import sys

from .cli import main

sys.exit(main())
