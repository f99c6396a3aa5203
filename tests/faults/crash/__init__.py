"""Crash-consistency tests: child processes that save or load are SIGKILLed at many points."""
