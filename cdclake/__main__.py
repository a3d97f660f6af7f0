import sys

from cdclake.cli.main import main

sys.exit(main())
