"""`python -m diffattn ...`: the `diffattn` command line (diffattn.cli) through a given interpreter."""

from diffattn import _command_line

if __name__ == "__main__":
    raise SystemExit(_command_line())
