"""`python -m diffattn ...`: the `diffattn` command line (diffattn.cli) through a given interpreter."""

from diffattn.console import main

if __name__ == "__main__":
    raise SystemExit(main())
