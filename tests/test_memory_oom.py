"""diag.memory.oom: parsing torch's out-of-memory messages."""
from __future__ import annotations

from diag.memory.oom import parse_oom


def test_parse_oom_messages():
    msg = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 15.77 GiB of which "
           "4.12 MiB is free. Of the allocated memory 14.9 GiB is allocated by PyTorch, and 310.5 MiB is "
           "reserved by PyTorch but unallocated.")
    d = parse_oom(msg)
    assert d["requested"] == 20 << 20 and d["device"] == "cuda:3"
    assert d["capacity"] == int(15.77 * (1 << 30)) and d["reserved_unallocated"] == int(310.5 * (1 << 20))
    assert d["reserved"] == d["allocated"] + d["reserved_unallocated"]
    old = ("CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 11.17 GiB total capacity; 9.80 GiB already "
           "allocated; 512.00 MiB free; 10.20 GiB reserved in total by PyTorch)")
    d = parse_oom(old)
    assert d["allocated"] == int(9.8 * (1 << 30)) and d["reserved"] == int(10.2 * (1 << 30))
    cpu = "[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: not enough memory: you tried to allocate 123 bytes."
    assert parse_oom(cpu) == {"requested": 123, "device": "cpu"}
    linux = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
             "tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")
    assert parse_oom(linux) == {"requested": 68719476736, "device": "cpu"}
    assert parse_oom("something else") == {}


def test_the_cpu_allocators_failure_is_an_oom():
    from diag.probe.frames import is_oom

    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                               "allocate memory: you tried to allocate 68719476736 bytes. Error code 12"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 123 bytes."))
    assert not is_oom(RuntimeError("shape mismatch"))
