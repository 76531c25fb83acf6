"""The command line's exit codes, in a module that imports nothing: the script's entry reads them before
the commands' modules (NumPy and the rest) have loaded."""

#: Some frames failed (each said in its own ``error:`` line); the others' outputs were written.
EXIT_FRAME_FAILURES = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
#: A run whose stdout's reader went away, as Python's documentation has it for BrokenPipeError.
EXIT_CLOSED_STDOUT = 1
