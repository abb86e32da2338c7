import sys

from iolens.cli import main

sys.exit(main())
