import sys

from whisperkv.cli import main

sys.exit(main())
