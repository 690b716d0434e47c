"""The ``hybridmem`` command line. Each subcommand lives in its own module, registered in
:data:`hybridmem.cli.main.COMMANDS`."""
