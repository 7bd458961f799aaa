"""`python -m jobtui.cli`: the `jobtui` command."""

from jobtui.cli.main import main

raise SystemExit(main())
