import sys

from cdclake.cli import main

sys.exit(main())
