"""What the benchmarks say of a peer (llama.cpp): how its process ended, and how it was built."""
import os
import signal


def describe_exit(code):
    """A process's return code in words: 'killed by signal 11 (SIGSEGV)', 'exit status 1'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return "killed by signal %d (%s)" % (-code, name)
    if code > 128:
        # A shell (or a wrapper) reports a signal as 128 + its number.
        try:
            return "exit status %d (signal %s)" % (code, signal.Signals(code - 128).name)
        except ValueError:
            pass
    return "exit status %d" % code


def llama_cpp_build(python):
    """The settings bench/setup_llamacpp_venv.sh built the peer with, read from beside its venv."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    try:
        with open(os.path.join(venv, "llama-cpp-build.txt")) as f:
            return f.read().strip()
    except OSError:
        return "unknown (no llama-cpp-build.txt beside %s)" % python
