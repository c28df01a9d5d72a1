"""The command line: the entry point and subcommands, the run's options and config, checks of bad input before models load, the terminal."""
