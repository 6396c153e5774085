"""``python -m txsink.cli``: the ``txsink`` command."""

import sys

from txsink.cli import main

sys.exit(main())
