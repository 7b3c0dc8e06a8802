#!/usr/bin/python3
"""torchrun, for Debian's python3-torch 1.13 on Python 3.11.

Debian's /usr/bin/torchrun crashes on Python 3.11 before starting any worker: in
torch.distributed.elastic.multiprocessing.api.to_map, because Std.from_str("0") returns None
(it finds a Std by iterating the IntFlag class, and since Python 3.11 iterating a flag class
skips the zero member NONE and the alias ALL). This wrapper replaces only Std.from_str, with one
that builds each Std by value, and then runs torchrun's own main(): same flags, same behaviour.
On a torch whose Std.from_str works it patches nothing.

    /usr/bin/python3 tests/launchers/torchrun/torchrun_py311.py --nnodes 1 --nproc_per_node 2 ...
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api

_Std = api.Std
_original_from_str = _Std.from_str


def _from_str(vm):
    """Std.from_str with values looked up by number: "1" -> OUT, "0:3,1:0" -> {0: ALL, 1: NONE}."""
    if re.fullmatch(api._VALUE_REGEX, vm):
        return _Std(int(vm))
    if re.fullmatch(api._MAPPING_REGEX, vm):
        return {int(i): _Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    return _original_from_str(vm)  # raises torchrun's own ValueError


if _Std.from_str("0") is None:
    _Std.from_str = staticmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
