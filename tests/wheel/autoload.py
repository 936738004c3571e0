"""torch.distributed's "ddplug" backend in a script that never imports ddplug
(tests/wheel/test-wheel.sh): torch's autoload of out-of-tree backends calls the
wheel's `torch.backends` entry point during `import torch`.

    python autoload.py on    2 spawned ranks: init_process_group("ddplug"),
                             all_reduce, send/recv; each writes
                             autoload-rankR.txt
    python autoload.py off   with TORCH_DEVICE_BACKEND_AUTOLOAD=0: nothing of
                             ddplug is imported and "ddplug" is unknown
"""

from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, port: int) -> None:
    loaded_by_torch = "ddplug" in sys.modules  # imported by torch's import, not by this script
    dist.init_process_group("ddplug", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    msg = torch.zeros(3)
    if rank == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=1)
    else:
        dist.recv(msg, src=0)
    with open(f"autoload-rank{rank}.txt", "w") as f:
        f.write(f"autoload rank {rank} backend {dist.get_backend()} sum {t.item():g} recv {msg.tolist()}"
                f" loaded_by_torch {loaded_by_torch}\n")
    dist.destroy_process_group()


def main() -> int:
    if sys.argv[1] == "off":
        assert "ddplug" not in sys.modules, "TORCH_DEVICE_BACKEND_AUTOLOAD=0, yet ddplug was imported"
        assert "ddplug" not in dist.Backend.backend_list, dist.Backend.backend_list
        print("autoload off: ddplug not imported, backend unknown")
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port), nprocs=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
