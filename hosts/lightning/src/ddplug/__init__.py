"""ddplug: data-parallel strategy plugins behind a stable C ABI."""

__version__ = "0.1.0"
