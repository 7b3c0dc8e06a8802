#!/usr/bin/env python3
"""Writes the binary seed inputs of the store fuzz targets (tcp_store_server, wire_format) into
tests/data/fuzz/<target>/. Rerun after a change to the store's protocol (tcp_store_protocol.h) or
to a harness's input layout (the comment at the top of tests/fuzz/<target>_fuzzer.cc).

The YAML targets' seeds are copies of configs/jobs/*.yaml, tests/data/bad_specs/*.yaml and
configs/cohortd.yaml (plus a few variants), made by hand.

  tests/fuzz/make_seeds.py
"""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MAGIC = 0x564B4F43  # kTcpStoreMagic, "COKV"
VERSION = 2  # kTcpStoreProtocolVersion
HELLO, SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUMKEYS, AUTH = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10


def u8(v): return struct.pack("<B", v)
def u32(v): return struct.pack("<I", v)
def i64(v): return struct.pack("<q", v)
def s(v): return u32(len(v)) + v
def ss(vs): return u32(len(vs)) + b"".join(s(v) for v in vs)
def frame(body): return u32(len(body)) + body


def hello(version=VERSION): return frame(u8(HELLO) + u32(MAGIC) + u32(version))


class StoreInput:
    """The tcp_store_server harness's records (see tcp_store_server_fuzzer.cc)."""

    def __init__(self, secret=False, small_limits=False, connections=1):
        self.data = bytearray([int(secret) | int(small_limits) << 1 | (connections - 1) << 2])

    def send(self, slot, data):
        for i in range(0, len(data), 255):
            chunk = data[i:i + 255]
            self.data += bytes([slot | 0 << 2, len(chunk)]) + chunk
        return self

    def tick(self, tens_of_ms):
        self.data += bytes([1 << 2, tens_of_ms])
        return self

    def read(self, slot, n=0):
        self.data += bytes([slot | 2 << 2, n])
        return self

    def reconnect(self, slot):
        self.data += bytes([slot | 3 << 2, 0])
        return self


def store_seeds():
    yield "ops", (StoreInput().send(0, hello()).read(0)
                  .send(0, frame(u8(SET) + s(b"rank0/addr") + s(b"10.0.0.1:1234"))).read(0)
                  .send(0, frame(u8(GET) + s(b"rank0/addr") + i64(1000))).read(0)
                  .send(0, frame(u8(ADD) + s(b"counter") + i64(5))).read(0)
                  .send(0, frame(u8(ADD) + s(b"counter") + i64(-2))).read(0)
                  .send(0, frame(u8(CAS) + s(b"leader") + s(b"") + s(b"rank3"))).read(0)
                  .send(0, frame(u8(CHECK) + ss([b"rank0/addr", b"counter"]))).read(0)
                  .send(0, frame(u8(DELETE) + s(b"rank0/addr"))).read(0)
                  .send(0, frame(u8(NUMKEYS))).read(0))
    yield "waiters", (StoreInput(connections=2).send(0, hello()).send(1, hello()).read(0).read(1)
                      .send(0, frame(u8(GET) + s(b"k") + i64(5000)))
                      .send(1, frame(u8(SET) + s(b"k") + s(b"v"))).read(0).read(1)
                      .send(0, frame(u8(WAIT) + ss([b"x", b"y"]) + i64(50))).tick(10).read(0)
                      .send(1, frame(u8(WAIT) + ss([b"k"]) + i64(0))).read(1))
    yield "pipelined", (StoreInput().send(0, hello() + frame(u8(GET) + s(b"late") + i64(100000))
                                      + frame(u8(SET) + s(b"a") + s(b"1")) + frame(u8(NUMKEYS)))
                        .reconnect(1).send(1, hello() + frame(u8(SET) + s(b"late") + s(b"x"))).read(0).read(1))
    yield "secret_wrong_answer", (StoreInput(secret=True).send(0, hello()).read(0)
                                  .send(0, frame(u8(AUTH) + s(b"\0" * 32))).read(0)
                                  .reconnect(0).send(0, frame(u8(SET) + s(b"k") + s(b"v"))))
    yield "handshake_timeouts", (StoreInput(secret=True, connections=4).send(0, hello(1))
                                 .tick(255).tick(255).tick(255).tick(255).tick(255))
    yield "limits", (StoreInput(small_limits=True, connections=2).send(0, hello()).send(1, hello())
                     .send(0, b"".join(frame(u8(SET) + s(b"key%d" % i) + s(b"v" * 100)) for i in range(10)))
                     .send(1, b"".join(frame(u8(GET) + s(b"key0") + i64(0)) for _ in range(6)))
                     .send(0, frame(u8(WAIT) + ss([b"a", b"b", b"c", b"d", b"e"]) + i64(10))))
    yield "bad_frames", (StoreInput(connections=3).send(0, hello()).send(0, u32(0xFFFFFFFF))
                         .send(1, u32(300) + b"x" * 20).send(2, hello() + frame(b"") + frame(u8(77)) + frame(u8(SET) + u32(1000))))


def wire_seeds():
    yield "fields", (u8(0) + u8(7) + u8(1) + u32(0xDEADBEEF) + u8(2) + i64(-5) + u8(3) + s(b"hello")
                     + u8(4) + ss([b"a", b"bc", b""]))
    yield "strs_limited", u8(129) + ss([b"x"]) + u8(129) + ss([b"x", b"y"])
    yield "frame", frame(u8(SET) + s(b"key") + s(b"value"))
    yield "truncated_str", u8(3) + u32(100) + b"short"
    yield "huge_count", u8(4) + u32(0xFFFFFFFF) + s(b"a")


def write(target, seeds):
    directory = os.path.join(ROOT, "tests", "data", "fuzz", target)
    os.makedirs(directory, exist_ok=True)
    for name, value in seeds:
        data = value.data if isinstance(value, StoreInput) else value
        with open(os.path.join(directory, name), "wb") as out:
            out.write(bytes(data))


if __name__ == "__main__":
    write("tcp_store_server", store_seeds())
    write("wire_format", wire_seeds())
