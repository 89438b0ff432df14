"""consumer.py DIR N SIZE: reads N files through pydyad's dyad_open (each
waits for its publication and transfer), checks them and prints "OK" per
good file, as upstream's pydyad_spsc consumer."""
import os
import sys

from pydyad import dyad_open
from producer import content


def main():
    directory, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    bad = 0
    for i in range(n):
        path = os.path.join(directory, f"data{i}.npy")
        with dyad_open(path, "rb") as f:
            data = f.read()
        if data == content(i, kib * 1024):
            print("OK", flush=True)
        else:
            print(f"BAD {path} ({len(data)} bytes)", flush=True)
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
