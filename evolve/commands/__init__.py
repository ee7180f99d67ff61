"""One module per `evolve` sub-command; each exposes `register(subparsers)`."""
