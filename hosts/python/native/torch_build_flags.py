"""Prints what CMake needs to build ddplug_torchfast against the torch of this
interpreter, one ``KEY=VALUE`` per line (lists joined by "|"); exits 1 (saying why on stderr) when
this interpreter has no torch with distributed support."""

import sys
import sysconfig

try:
    import torch
    import torch.distributed as dist
    from torch.utils.cpp_extension import include_paths, library_paths
except Exception as exc:  # no torch here: the backend runs in Python only
    print(f"no torch: {exc}", file=sys.stderr)
    sys.exit(1)
if not dist.is_available():
    print("torch without distributed support", file=sys.stderr)
    sys.exit(1)
print("INCLUDES=" + "|".join(include_paths() + [sysconfig.get_paths()["include"]]))
print("LIBDIRS=" + "|".join(library_paths()))
print("SUFFIX=" + sysconfig.get_config_var("EXT_SUFFIX"))
# The stamp ddplug/distributed/native.py compares with the running torch
# (its _torch_stamp: the same three fields): a C++ extension is tied to one build.
print(f"VERSION={torch.__version__} {torch.version.git_version} cxx11abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print("CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
