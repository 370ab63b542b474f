"""The command line: flags (llama-server's among them) and subcommands."""
import sys

try:
    import ggserve.native  # noqa: F401  (loads ggml: the CPU variant GGSERVE_CPU_VARIANT names)
except ImportError as e:
    if "GGSERVE_CPU_VARIANT" not in str(e):
        raise
    # a setting, not a bug: the reason alone, and exit 1 before anything else starts
    sys.exit(f"ggserve: {e}")
