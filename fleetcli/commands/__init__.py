"""One module per subcommand family; each has ``register(subparsers)``."""
