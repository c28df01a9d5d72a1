"""The command line: the entry point and its subcommands, the run's options and config, the one check
of bad input before models load, the terminal."""
