#!/usr/bin/env python3
"""gen_seeds.py - writes the seed corpora: of fuzz_dispatch (corpus/frame: request sequences of
two sessions, framed and cut into the target's chunk format, 1 byte: session << 7 | length,
then bytes) and of fuzz_codec (corpus/codec: single Request and Response payloads)."""
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
INSERT_KEYS, MATCH_KEYS, EXISTS_KEYS = 40, 41, 42
pkeys = [bytes([i]) * 32 for i in range(1, 7)]

def keys_body(head, keys, tail=b""):
    """A hash-keyed call: head fields, then the keys as repeated bytes field 3, then tail."""
    return head + b"".join(field(3, 2, k) for k in keys) + tail
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
    "insert_match_keys": [(0, request(1, ATTACH, msg(p=(1, b"f")))),
                          (1, request(1, ATTACH, msg(p=(1, b"f")))),
                          (0, request(2, ALLOC, msg(pid=(1, 0), pages=(3, 4)))),
                          (0, request(3, INSERT_KEYS, keys_body(msg(l=(1, 1), ns=(2, 5)), pkeys[:4],
                                                                msg(pg=(4, [0, 1, 2, 3]))))),
                          (1, request(2, EXISTS_KEYS, keys_body(msg(pid=(1, 0), ns=(2, 5)), pkeys))),
                          (1, request(3, MATCH_KEYS, keys_body(msg(pid=(1, 0), ns=(2, 5)), pkeys,
                                                               msg(lock=(4, 1))))),
                          (1, request(4, LOAD, msg(k=(1, 1)))),
                          (1, request(5, RELEASE, msg(k=(1, 1)))),
                          (0, request(4, MATCH, msg(pid=(1, 0), t=(2, toks), ns=(3, 5)))),
                          (0, request(5, EXISTS_KEYS, keys_body(msg(pid=(1, 0), ns=(2, 6)),
                                                                [b"", b"x" * 65])))],
    "foreign": [(0, request(1, ATTACH, msg(p=(1, b"f")))), (1, request(1, ATTACH, msg(p=(1, b"f")))),
                (0, request(2, ALLOC, msg(pid=(1, 0), pages=(3, 3)))),
                (1, request(2, FREE, msg(l=(1, 1)))), (1, request(3, DETACH, msg(pid=(1, 0))))],
}
top = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
out = os.path.join(top, "frame")
os.makedirs(out, exist_ok=True)
for name, seq in seqs.items():
    data = bytes([0x03])  # both sessions start past Hello
    for who, req in seq:
        data += chunks(who, frame(req))
    open(os.path.join(out, name), "wb").write(data)
print("wrote", len(seqs), "seeds to", out)

# fuzz_codec: each request above as one payload, and replies (Response: id 1, status 2, the
# result in the same field number as its call)
def response(rid, code, message, result, body):
    st = msg(c=(1, code)) + (field(2, 2, message) if message else b"")
    return msg(id=(1, rid), st=(2, st)) + (field(result, 2, body) if result else b"")

codec = {"req_%s_%d" % (name, i): req for name, seq in seqs.items() for i, (_, req) in enumerate(seq)}
codec.update({
    "resp_ping": response(2, 0, b"", PING, msg(n=(1, 7))),
    "resp_alloc": response(2, 0, b"", ALLOC, msg(l=(1, 9), t=(2, 1), pg=(3, [0, 1, 300, 2**32 - 1]))),
    "resp_free": response(3, 0, b"", FREE, msg(f=(1, 2), lp=(2, 0))),
    "resp_match": response(4, 0, b"", MATCH, msg(t=(1, 32), d=(2, [1, 2]), h=(3, [3]), k=(4, 5))),
    "resp_capacity": response(5, 8, b"full", 0, b"") + field(2, 2, field(3, 2, msg(t=(1, 1), r=(2, 99)))),
})
out = os.path.join(top, "codec")
os.makedirs(out, exist_ok=True)
for name, data in codec.items():
    open(os.path.join(out, name), "wb").write(data)
print("wrote", len(codec), "seeds to", out)
