#!/usr/bin/env python3
# module_fetch.py RANK UPATH: fetches UPATH from the dyad.so module of broker
# RANK the way upstream DYAD's FLUX_RPC consumers do (a streaming dyad.fetch,
# raw responses until ENODATA) and writes the bytes to stdout. On an error
# response it prints "errno N: MESSAGE" on stderr and exits with 10 + N
# (capped at 120). Run with `flux python` inside the instance.
import errno
import sys

import flux
import flux.constants
from flux.core.inner import ffi, raw
from flux.rpc import RPC


def main():
    rank = int(sys.argv[1])
    upath = sys.argv[2]
    h = flux.Flux()
    f = RPC(h, "dyad.fetch", {"upath": upath}, nodeid=rank,
            flags=flux.constants.FLUX_RPC_STREAMING)
    data = ffi.new("void **")
    size = ffi.new("size_t *")
    out = sys.stdout.buffer
    responses = 0
    while True:
        try:
            raw.flux_rpc_get_raw(f.handle, data, size)
        except OSError as e:
            if e.errno == errno.ENODATA:
                break
            msg = raw.flux_future_error_string(f.handle)
            if isinstance(msg, bytes):
                text = msg.decode(errors="replace")
            elif msg is None or msg == ffi.NULL:
                text = e.strerror
            else:
                text = ffi.string(msg).decode(errors="replace")
            sys.stderr.write("errno %d: %s\n" % (e.errno, text))
            return min(10 + e.errno, 120)
        responses += 1
        out.write(ffi.buffer(data[0], size[0]))
        raw.flux_future_reset(f.handle)
    out.flush()
    sys.stderr.write("responses: %d\n" % responses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
