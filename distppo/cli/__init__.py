"""The command line: one module per subcommand, each a parser and a handler (main.py)."""
