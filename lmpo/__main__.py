import sys

from lmpo.cli.main import main

sys.exit(main())
