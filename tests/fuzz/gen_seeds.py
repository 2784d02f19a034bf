#!/usr/bin/env python3
"""gen_seeds.py - writes the seed corpus of fuzz_dispatch: request sequences of two sessions,
framed and cut into the target's chunk format (1 byte: session << 7 | length, then bytes)."""
import os, sys

def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)

def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload

def msg(**fields):
    """fields: name=(num, value); ints as varints, bytes/lists as length-delimited."""
    out = b""
    for num, val in fields.values():
        if isinstance(val, int):
            out += field(num, 0, val)
        elif isinstance(val, list):
            out += field(num, 2, b"".join(varint(x) for x in val))
        else:
            out += field(num, 2, val)
    return out

def request(rid, call, body):
    return msg(id=(1, rid), call=(call, body))

def frame(b):
    return len(b).to_bytes(4, "little") + b

def chunks(who, data, size=40):
    out = b""
    for i in range(0, len(data), size):
        part = data[i:i + size]
        out += bytes([who << 7 | len(part)]) + part
    return out

HELLO, PING, STATUS, ATTACH, DETACH, ALLOC, EXTEND, FREE, INSERT, MATCH, RELEASE, LOAD, EVICT = range(10, 23)
toks = list(range(100, 132))
seqs = {
    "hello_ping": [(0, request(1, HELLO, msg(v=(1, 1)))), (0, request(2, PING, msg(n=(1, 7))))],
    "alloc_free": [(0, request(1, ATTACH, msg(p=(1, b"f")))),
                   (0, request(2, ALLOC, msg(pid=(1, 0), pages=(3, 4)))),
                   (0, request(3, EXTEND, msg(l=(1, 1), pages=(3, 2)))),
                   (0, request(4, FREE, msg(l=(1, 1), pages=(2, [0, 1])))),
                   (0, request(5, FREE, msg(l=(1, 1))))],
    "insert_match": [(0, request(1, ATTACH, msg(p=(1, b"f")))),
                     (1, request(1, ATTACH, msg(p=(1, b"f")))),
                     (0, request(2, ALLOC, msg(pid=(1, 0), pages=(3, 8)))),
                     (0, request(3, INSERT, msg(l=(1, 1), t=(2, toks), pg=(3, list(range(8)))))),
                     (1, request(2, MATCH, msg(pid=(1, 0), t=(2, toks), lock=(4, 1)))),
                     (1, request(3, LOAD, msg(k=(1, 1)))),
                     (1, request(4, RELEASE, msg(k=(1, 1)))),
                     (0, request(4, EVICT, msg(pid=(1, 0), tok=(3, 16)))),
                     (1, request(5, FREE, msg(l=(1, 1))))],
    "foreign": [(0, request(1, ATTACH, msg(p=(1, b"f")))), (1, request(1, ATTACH, msg(p=(1, b"f")))),
                (0, request(2, ALLOC, msg(pid=(1, 0), pages=(3, 3)))),
                (1, request(2, FREE, msg(l=(1, 1)))), (1, request(3, DETACH, msg(pid=(1, 0))))],
}
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "frame")
os.makedirs(out, exist_ok=True)
for name, seq in seqs.items():
    data = bytes([0x03])  # both sessions start past Hello
    for who, req in seq:
        data += chunks(who, frame(req))
    open(os.path.join(out, name), "wb").write(data)
print("wrote", len(seqs), "seeds to", out)
