"""The binding of libddplug (the bottom layer; nothing here imports the rest of
the package): the ctypes mirror of the C ABI (:mod:`._capi`), the name tables
read from the library (:mod:`._names`), how tensors and arrays cross into C
(:mod:`._buffers`), the library's log lines in Python ``logging``
(:mod:`._logbridge`) and the ``ddplug`` console script (:mod:`._command`)."""
